//! XDP SynGate with real peers: tlsgate serves in one network namespace,
//! curl fetches from another over a veth pair, and every SYN to the TLS
//! port is answered from XDP with a cookie (`tlsgate xdp attach --mode
//! always`). The kernel accepts the final ACKs (its own cookie check) and
//! the connections carry window scaling, SACK and timestamps.
//!
//! Needs root (network namespaces, BPF): CI runs as root. Not being root
//! is a failure, never a skip. Traffic stays between the namespaces the
//! test makes (addresses in 10.254.0.0/16 and fd00:254::/32 inside them).
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn run(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    out
}

fn ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sh(args: &[&str]) -> String {
    ok(Command::new(args[0]).args(&args[1..]))
}

fn require_root() {
    let uid = sh(&["id", "-u"]);
    assert_eq!(
        uid.trim(),
        "0",
        "the XDP tests need root (network namespaces, BPF); CI runs them as root"
    );
}

/// Two network namespaces joined by a veth pair: the server end runs
/// SynGate, the client end a pass program (a veth end that receives
/// XDP_TX frames drops them unless it has an XDP program of its own).
/// TX checksum offload is off on both ends, else XDP sees partial
/// checksums (field notes). Everything goes when it is dropped.
struct Lab {
    srv: String,
    cli: String,
    srv_if: String,
    cli_if: String,
    /// One end of an idle veth pair in the client namespace, for the flood
    /// generator's XDP program (`SynFlood::xdp_anchor`).
    anchor_if: String,
    _dir: tempfile::TempDir,
}

const SRV4: &str = "10.254.1.1";
const CLI4: &str = "10.254.1.2";
const SRV6: &str = "fd00:254:1::1";
const CLI6: &str = "fd00:254:1::2";

impl Lab {
    fn new(tag: &str) -> Lab {
        require_root();
        let id = std::process::id();
        let lab = Lab {
            srv: format!("tgx-{tag}-s-{id}"),
            cli: format!("tgx-{tag}-c-{id}"),
            // Interface names: at most 15 bytes.
            srv_if: format!("tg{tag}s{}", id % 1_000_000),
            cli_if: format!("tg{tag}c{}", id % 1_000_000),
            anchor_if: format!("tg{tag}a{}", id % 1_000_000),
            _dir: tempfile::tempdir().unwrap(),
        };
        let (s, c) = (lab.srv.as_str(), lab.cli.as_str());
        sh(&["ip", "netns", "add", s]);
        sh(&["ip", "netns", "add", c]);
        for ns in [s, c] {
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        lab.add_pair();
        let anchor = format!(
            "ip -n {c} link add {} type veth peer name tg{tag}b{}",
            lab.anchor_if,
            id % 1_000_000
        );
        sh(&anchor.split(' ').collect::<Vec<_>>());
        lab
    }

    /// The veth pair between the namespaces, addressed and up, with the
    /// pass program on the client's end.
    fn add_pair(&self) {
        let (s, c) = (self.srv.as_str(), self.cli.as_str());
        sh(&[
            "ip",
            "link",
            "add",
            &self.srv_if,
            "netns",
            s,
            "type",
            "veth",
            "peer",
            "name",
            &self.cli_if,
            "netns",
            c,
        ]);
        for (ns, ifname, a4, a6) in [(s, &self.srv_if, SRV4, SRV6), (c, &self.cli_if, CLI4, CLI6)] {
            sh(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("{a4}/24"),
                "dev",
                ifname,
            ]);
            sh(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("{a6}/64"),
                "dev",
                ifname,
                "nodad",
            ]);
            sh(&["ip", "-n", ns, "link", "set", ifname, "up"]);
            sh(&[
                "ip", "netns", "exec", ns, "ethtool", "-K", ifname, "tx", "off",
            ]);
        }
        let obj = self._dir.path().join("syngate.bpf.o");
        std::fs::write(&obj, tlsgate_xdp::OBJECT).unwrap();
        sh(&[
            "ip",
            "-n",
            c,
            "link",
            "set",
            "dev",
            &self.cli_if,
            "xdpdrv",
            "obj",
            obj.to_str().unwrap(),
            "sec",
            "xdp",
            "program",
            "xdp_pass",
        ]);
    }

    fn netns_path(ns: &str) -> String {
        format!("--net=/run/netns/{ns}")
    }

    /// `tlsgate ARGS` in the server namespace. nsenter, not `ip netns
    /// exec`: the latter remounts /sys, hiding the host's bpffs where the
    /// pins live.
    fn tlsgate(&self, args: &[&str]) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(Self::netns_path(&self.srv)).arg(bin()).args(args);
        c
    }

    fn in_srv(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.srv]).args(args);
        c
    }

    fn in_cli(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.cli]).args(args);
        c
    }

    fn sysctl(&self, name: &str) -> String {
        ok(&mut self.in_srv(&["sysctl", "-n", name]))
            .trim()
            .to_string()
    }

    fn xdp_on_srv_if(&self) -> bool {
        let out = sh(&["ip", "-n", &self.srv, "link", "show", "dev", &self.srv_if]);
        out.contains("xdp")
    }

    /// `ip -j -s link show` of an interface in a namespace.
    fn link(ns: &str, ifname: &str) -> serde_json::Value {
        let out = sh(&["ip", "-n", ns, "-j", "-s", "link", "show", "dev", ifname]);
        serde_json::from_str::<serde_json::Value>(&out).unwrap()[0].clone()
    }

    fn mac(ns: &str, ifname: &str) -> [u8; 6] {
        let link = Self::link(ns, ifname);
        let text = link["address"].as_str().unwrap().to_string();
        let mut mac = [0u8; 6];
        for (m, part) in mac.iter_mut().zip(text.split(':')) {
            *m = u8::from_str_radix(part, 16).unwrap();
        }
        mac
    }

    /// Frames the client end could not hand to the server end: skbs, which
    /// veth counts as the sender's TX drops, and xdp_frames (XDP_TX), which
    /// it counts per queue as `xdp_xmit_errors` (`ethtool -S`).
    fn cli_tx_dropped(&self) -> u64 {
        let skbs = Self::link(&self.cli, &self.cli_if)["stats64"]["tx"]["dropped"]
            .as_u64()
            .unwrap();
        let stats = ok(&mut self.in_cli(&["ethtool", "-S", &self.cli_if]));
        let frames: u64 = stats
            .lines()
            .filter_map(|l| l.trim().split_once(':'))
            .filter(|(k, _)| k.ends_with("xdp_xmit_errors"))
            .map(|(_, v)| v.trim().parse::<u64>().unwrap())
            .sum();
        skbs + frames
    }

    /// Sets the MTU of the server's end.
    fn set_srv_mtu(&self, mtu: u32) {
        let mtu = mtu.to_string();
        sh(&[
            "ip",
            "-n",
            &self.srv,
            "link",
            "set",
            "dev",
            &self.srv_if,
            "mtu",
            &mtu,
        ]);
    }

    /// `tlsgate xdp attach --mode always --manage-sysctls` for `port`.
    fn attach_always_cmd(&self, port: u16) -> Command {
        self.tlsgate(&[
            "xdp",
            "attach",
            "--iface",
            &self.srv_if,
            "--port",
            &port.to_string(),
            "--mode",
            "always",
            "--manage-sysctls",
        ])
    }

    /// [`Lab::attach_always_cmd`], which must succeed; what it printed.
    fn attach_always(&self, port: u16) -> String {
        ok(&mut self.attach_always_cmd(port))
    }

    fn stats(&self) -> serde_json::Value {
        let out = ok(&mut self.tlsgate(&["xdp", "stats", "--iface", &self.srv_if, "--json"]));
        serde_json::from_str(&out).unwrap()
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = self
            .tlsgate(&["xdp", "detach", "--iface", &self.srv_if])
            .output();
        let _ = std::fs::remove_dir_all(PathBuf::from(tlsgate_xdp::PIN_ROOT).join(&self.srv_if));
        // Deleting a namespace deletes the veth ends in it.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.srv])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.cli])
            .output();
    }
}

/// tlsgate serving in the server namespace.
struct Tlsgate {
    child: Child,
    log: PathBuf,
}

impl Tlsgate {
    /// Starts tlsgate and waits until it listens; `server` goes into the
    /// `[server]` table.
    fn start(lab: &Lab, fx: &Fixture, server: &str) -> Tlsgate {
        let t = Tlsgate::spawn(lab, fx, server, "");
        t.wait_log(&format!("listening on https://[{SRV6}]:8443"));
        t
    }

    /// Starts tlsgate; `tail` goes at the end of the file (an `[xdp]` table).
    fn spawn(lab: &Lab, fx: &Fixture, server: &str, tail: &str) -> Tlsgate {
        let listen = format!("\"{SRV4}:8443\", \"[{SRV6}]:8443\"");
        Tlsgate::spawn_on(lab, fx, &listen, server, tail)
    }

    /// [`Tlsgate::spawn`] with the listener's `listen` list (TOML items).
    fn spawn_on(lab: &Lab, fx: &Fixture, listen: &str, server: &str, tail: &str) -> Tlsgate {
        let config = format!(
            "[server]\nworkers = 2\n{server}\n\n[admin]\nlisten = \"127.0.0.1:9090\"\n\n[[listener]]\nlisten = [{listen}]\nroot = {root:?}\n\n[[listener.certificate]]\ncert = {cert:?}\nkey = {key:?}\n\n{tail}\n",
            root = fx.root,
            cert = fx.cert.cert,
            key = fx.cert.key,
        );
        let path = fx.write_config(&config);
        let log = fx.path().join("tlsgate.log");
        let child = lab
            .tlsgate(&["serve", "--config", path.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Tlsgate { child, log }
    }

    fn signal(&self, name: &str) {
        sh(&["kill", &format!("-{name}"), &self.child.id().to_string()]);
    }

    fn wait_exit(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "tlsgate did not exit:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_log(&self, needle: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.log().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "no {needle:?} in tlsgate's log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Tlsgate {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// 10 MiB + 13 bytes, not a multiple of any buffer size.
fn ten_mib(fx: &Fixture) -> Vec<u8> {
    let data: Vec<u8> = (0..(10usize << 20) + 13)
        .map(|i| (i * 131 % 251) as u8)
        .collect();
    std::fs::write(fx.root.join("ten.bin"), &data).unwrap();
    data
}

fn curl_args(url: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["curl", "-k", "-sS", "--max-time", "60", "-o", "-"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a.push(url.to_string());
    a
}

fn nstat(lab: &Lab, name: &str) -> u64 {
    let out = ok(&mut lab.in_srv(&["nstat", "-asz", name]));
    out.lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn counters(stats: &serde_json::Value) -> (u64, u64, u64, u64) {
    let c = &stats["ports"][0]["counters"];
    let f = |k: &str| c[k].as_u64().unwrap();
    (f("syn_seen"), f("cookies"), f("passed"), f("errors"))
}

/// `wscale:SND,RCV` of the one established connection on :8443, with the
/// option flags ss prints before it (`ts`, `sack`), polled while curl runs.
fn server_socket_info(lab: &Lab) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out =
            ok(&mut lab.in_srv(&["ss", "-tieO", "state", "established", "( sport = :8443 )"]));
        if let Some(line) = out.lines().find(|l| l.contains("wscale:")) {
            return line.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no established connection on :8443 in the server namespace:\n{out}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Fetches ten.bin (`data`) over IPv4, rate-limited so that ss sees the
/// server's socket while it lasts; that socket's [`server_socket_info`].
fn slow_fetch_socket_info(lab: &Lab, data: &[u8]) -> String {
    let slow = curl_args(
        &format!("https://{SRV4}:8443/ten.bin"),
        &["--limit-rate", "4M"],
    );
    let child = lab
        .in_cli(&slow.iter().map(String::as_str).collect::<Vec<_>>())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let info = server_socket_info(lab);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "curl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout == data, "10 MiB over IPv4 differ");
    eprintln!("server socket: {}", info.trim());
    info
}

/// `server_socket_info`'s receive window scale (`wscale:SND,RCV`).
fn rcv_wscale(info: &str) -> Option<u64> {
    info.split("wscale:")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.split(',').nth(1))
        .and_then(|s| s.parse().ok())
}

#[test]
fn tls_through_xdp_cookies_over_ipv4_and_ipv6() {
    let lab = Lab::new("a");
    let fx = Fixture::new();
    let data = ten_mib(&fx);
    let server = Tlsgate::start(&lab, &fx, "");
    let before = (
        lab.sysctl("net.ipv4.tcp_syncookies"),
        lab.sysctl("net.ipv4.tcp_timestamps"),
    );

    // Without the sysctls always needs, attach refuses and names them.
    if before.0 != "2" {
        let out = run(&mut lab.tlsgate(&[
            "xdp",
            "attach",
            "--iface",
            &lab.srv_if,
            "--port",
            "8443",
            "--mode",
            "always",
        ]));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("net.ipv4.tcp_syncookies"), "{err}");
        assert!(!lab.xdp_on_srv_if());
    }

    let attached = lab.attach_always(8443);
    let wscale: u32 = attached
        .split("window scale ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no window scale in {attached:?}"));
    assert!(
        lab.xdp_on_srv_if(),
        "attach left no program on the interface"
    );
    assert_eq!(lab.sysctl("net.ipv4.tcp_syncookies"), "2");
    assert_eq!(lab.sysctl("net.ipv4.tcp_timestamps"), "2");

    // 10 MiB over TLS 1.3 (IPv4, rate-limited so that ss sees the socket),
    // TLS 1.2 over IPv4 and TLS 1.3 over IPv6, each through a cookie.
    let info = slow_fetch_socket_info(&lab, &data);
    assert!(info.contains(" ts "), "no timestamps: {info}");
    assert!(info.contains(" sack "), "no SACK: {info}");
    assert_eq!(
        rcv_wscale(&info),
        Some(u64::from(wscale)),
        "the server's receive window scale is the one XDP advertised: {info}"
    );

    for (url, extra) in [
        (
            format!("https://{SRV4}:8443/ten.bin"),
            &["--tlsv1.2", "--tls-max", "1.2"][..],
        ),
        (format!("https://[{SRV6}]:8443/ten.bin"), &[][..]),
    ] {
        let args = curl_args(&url, extra);
        let out = run(&mut lab.in_cli(&args.iter().map(String::as_str).collect::<Vec<_>>()));
        assert!(
            out.status.success(),
            "curl {url}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stdout == data,
            "10 MiB from {url} differ ({} bytes)",
            out.stdout.len()
        );
    }

    // A client whose SYN carries only MSS (24 bytes of TCP, so the SYN-ACK
    // needs a bigger frame than the SYN): no timestamps, so the cookie can
    // carry neither SACK nor window scale, and the reply offers neither.
    for knob in ["tcp_timestamps", "tcp_sack", "tcp_window_scaling"] {
        ok(&mut lab.in_cli(&["sysctl", "-qw", &format!("net.ipv4.{knob}=0")]));
    }
    let args = curl_args(&format!("https://{SRV4}:8443/big.bin"), &[]);
    let out = run(&mut lab.in_cli(&args.iter().map(String::as_str).collect::<Vec<_>>()));
    assert!(
        out.status.success(),
        "curl without TCP options: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout == fx.big, "1 MiB without TCP options differs");

    let stats = lab.stats();
    let (syns, cookies, passed, errors) = counters(&stats);
    eprintln!("stats: {stats}");
    // Four connections, each SYN answered from XDP.
    assert!(cookies >= 4, "cookies issued: {stats}");
    assert_eq!(syns, cookies + passed, "{stats}");
    assert_eq!(errors, 0, "{stats}");
    let nstat = ok(&mut lab.in_srv(&["nstat", "-asz", "TcpExtSyncookiesRecv"]));
    let recv: u64 = nstat
        .lines()
        .find_map(|l| l.strip_prefix("TcpExtSyncookiesRecv"))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(
        recv >= 3,
        "the kernel accepted {recv} cookie ACKs:\n{nstat}"
    );
    let text = ok(&mut lab.tlsgate(&["xdp", "stats", "--iface", &lab.srv_if]));
    assert!(
        text.contains("8443") && text.contains("mode always"),
        "{text}"
    );

    // Detach: no program, no pins, the sysctls as they were; the kernel
    // alone still serves.
    ok(&mut lab.tlsgate(&["xdp", "detach", "--iface", &lab.srv_if]));
    assert!(!lab.xdp_on_srv_if(), "a program is left after detach");
    assert!(!PathBuf::from(tlsgate_xdp::PIN_ROOT)
        .join(&lab.srv_if)
        .exists());
    assert_eq!(
        (
            lab.sysctl("net.ipv4.tcp_syncookies"),
            lab.sysctl("net.ipv4.tcp_timestamps")
        ),
        before
    );
    let args = curl_args(&format!("https://{SRV4}:8443/hello.txt"), &[]);
    let out = ok(&mut lab.in_cli(&args.iter().map(String::as_str).collect::<Vec<_>>()));
    assert_eq!(out, HELLO);
    drop(server);
}

fn fetch_hello(lab: &Lab) {
    let args = curl_args(&format!("https://{SRV4}:8443/hello.txt"), &[]);
    let out = ok(&mut lab.in_cli(&args.iter().map(String::as_str).collect::<Vec<_>>()));
    assert_eq!(out, HELLO);
}

/// auto mode against a bounded spoofed SYN flood (500 SYNs at 1,000/s from
/// 10.254.2.7, a range routed inside the namespaces; the client namespace
/// drops the SYN-ACKs, so the kernel's SYN queue fills): in peacetime the
/// probe finds no pressure and SYNs pass to the kernel; once the queue is
/// full a probe gets a cookie, SynGate enters flood mode and answers every
/// SYN, a legitimate client still gets through, the source shows in the top
/// sources; when the queue has drained and t2 has passed, flood mode ends
/// and the kernel answers again.
#[test]
fn auto_mode_takes_over_during_a_syn_flood_and_hands_back() {
    let lab = Lab::new("b");
    let fx = Fixture::new();
    // A short SYN queue, and half-open connections that die within ~3 s
    // (one SYN-ACK retransmission), so the flood's queue drains in the test.
    let server = Tlsgate::start(&lab, &fx, "backlog = 32");
    ok(&mut lab.in_srv(&["sysctl", "-qw", "net.ipv4.tcp_synack_retries=1"]));
    ok(&mut lab.in_srv(&["ip", "route", "add", "10.254.2.0/24", "via", CLI4]));
    ok(&mut lab.tlsgate(&[
        "xdp",
        "attach",
        "--iface",
        &lab.srv_if,
        "--port",
        "8443",
        "--mode",
        "auto",
        "--t1",
        "20ms",
        "--t2",
        "500ms",
        "--top-sample",
        "1",
        "--manage-sysctls",
    ]));
    assert_eq!(lab.sysctl("net.ipv4.tcp_syncookies"), "1");

    // Peacetime: probes find the queue empty, the kernel answers.
    for _ in 0..3 {
        fetch_hello(&lab);
        std::thread::sleep(Duration::from_millis(30));
    }
    let st = lab.stats();
    let (syns, cookies, passed, _) = counters(&st);
    assert_eq!((cookies, passed), (0, syns), "peacetime: {st}");
    assert!(
        st["ports"][0]["counters"]["sampled"].as_u64().unwrap() >= 1,
        "{st}"
    );

    let flood = run(&mut lab.in_cli(&[
        "timeout",
        "20",
        "hping3",
        "-q",
        "-S",
        "-p",
        "8443",
        "-a",
        "10.254.2.7",
        "-c",
        "500",
        "-i",
        "u1000",
        SRV4,
    ]));
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&flood.stdout),
        String::from_utf8_lossy(&flood.stderr)
    );
    assert!(
        report.contains("500 packets transmitted"),
        "hping3: {report}"
    );
    // Still in flood mode (t2 has not passed): a client gets through.
    fetch_hello(&lab);

    let st = lab.stats();
    eprintln!("after the flood: {st}");
    let (syns, cookies, passed, errors) = counters(&st);
    let port = &st["ports"][0];
    assert!(syns >= 500 + 4, "every SYN seen: {st}");
    assert_eq!(syns, cookies + passed, "{st}");
    assert_eq!(errors, 0, "{st}");
    assert!(cookies >= 100, "XDP answered the flood: {st}");
    assert!(
        port["state"]["flood_entered"].as_u64().unwrap() >= 1,
        "{st}"
    );
    // The SYN queue was full when SynGate took over. The kernel counts a
    // full queue met with cookies on in TCPReqQFullDoCookies, whether its
    // own SYN handling met it or SynGate's probe (the cookie helper) did.
    // SyncookiesSent would need a flood SYN to reach the kernel after the
    // queue filled and before the next probe: when the probe is the first
    // SYN to find it full (a flood at 1/ms, a probe every t1 = 20 ms), none
    // does, and that check failed a loaded CI run.
    assert!(
        nstat(&lab, "TcpExtTCPReqQFullDoCookies") > 0,
        "the SYN queue was never full: {st}"
    );
    let top = &st["top_sources"][0];
    assert_eq!(top["prefix"], "10.254.2.7/32", "{st}");
    assert!(top["syns"].as_u64().unwrap() <= 500, "{st}");

    // The half-open connections die (~3 s), t2 passes: the next SYN ends
    // flood mode, its probe finds no pressure, the kernel answers it.
    std::thread::sleep(Duration::from_secs(5));
    let before = counters(&lab.stats()).1;
    fetch_hello(&lab);
    let st = lab.stats();
    eprintln!("after the drain: {st}");
    let port = &st["ports"][0];
    assert!(port["state"]["flood_left"].as_u64().unwrap() >= 1, "{st}");
    assert_eq!(port["state"]["flood"], false, "{st}");
    assert_eq!(counters(&st).1, before, "peacetime again, no cookie: {st}");

    ok(&mut lab.tlsgate(&["xdp", "detach", "--iface", &lab.srv_if]));
    assert!(!lab.xdp_on_srv_if());
    drop(server);
}

fn metrics(lab: &Lab) -> String {
    ok(&mut lab.in_srv(&[
        "curl",
        "-sS",
        "--max-time",
        "10",
        "http://127.0.0.1:9090/metrics",
    ]))
}

/// `tlsgate_xdp_attached` of the server's interface in /metrics.
fn xdp_attached(lab: &Lab) -> Option<f64> {
    let m = metrics(lab);
    let v = metric(
        &m,
        &format!("tlsgate_xdp_attached{{interface=\"{}\"}}", lab.srv_if),
    );
    eprintln!("tlsgate_xdp_attached: {v:?}");
    v
}

fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
}

/// `tlsgate serve` with `[xdp]`: attached at start with the sysctls set,
/// connections through cookies, counters in /metrics, everything undone at
/// SIGTERM; after a SIGKILL the program is gone with the process and the
/// next start cleans up the pins and sysctls left behind; a start that
/// cannot attach stops with exit 2 naming the sysctl, or with `optional`
/// serves unprotected and says so.
#[test]
fn serve_attaches_from_config_and_cleans_up_after_exit_and_crash() {
    let lab = Lab::new("c");
    let fx = Fixture::new();
    let before = (
        lab.sysctl("net.ipv4.tcp_syncookies"),
        lab.sysctl("net.ipv4.tcp_timestamps"),
    );
    let xdp = format!(
        "[xdp]\ninterface = \"{}\"\nmode = \"always\"\nmanage_sysctls = true\n",
        lab.srv_if
    );
    let pins = PathBuf::from(tlsgate_xdp::PIN_ROOT).join(&lab.srv_if);

    let mut s = Tlsgate::spawn(&lab, &fx, "", &xdp);
    s.wait_log(&format!("listening on https://[{SRV6}]:8443"));
    s.wait_log(&format!("XDP SynGate attached to {}", lab.srv_if));
    assert!(lab.xdp_on_srv_if());
    assert_eq!(lab.sysctl("net.ipv4.tcp_syncookies"), "2");
    for url in [
        format!("https://{SRV4}:8443/big.bin"),
        format!("https://[{SRV6}]:8443/big.bin"),
    ] {
        let args = curl_args(&url, &[]);
        let out = run(&mut lab.in_cli(&args.iter().map(String::as_str).collect::<Vec<_>>()));
        assert!(out.status.success() && out.stdout == fx.big, "{url}");
    }
    let m = metrics(&lab);
    let label = format!("{{interface=\"{}\",port=\"8443\"}}", lab.srv_if);
    let cookies = metric(&m, &format!("tlsgate_xdp_cookies_total{label}"));
    assert!(cookies.is_some_and(|c| c >= 2.0), "{m}");
    assert_eq!(
        metric(
            &m,
            &format!("tlsgate_xdp_attached{{interface=\"{}\"}}", lab.srv_if)
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(counters(&lab.stats()).3, 0);

    s.signal("TERM");
    assert!(s.wait_exit().success(), "{}", s.log());
    assert!(s.log().contains("XDP SynGate detached"), "{}", s.log());
    assert!(!lab.xdp_on_srv_if(), "program left after SIGTERM");
    assert!(!pins.exists(), "pins left after SIGTERM");
    assert_eq!(
        (
            lab.sysctl("net.ipv4.tcp_syncookies"),
            lab.sysctl("net.ipv4.tcp_timestamps")
        ),
        before
    );
    drop(s);

    // A crash: the program goes with the process, the pins and sysctls
    // stay until the next start cleans them up.
    let mut s = Tlsgate::spawn(&lab, &fx, "", &xdp);
    s.wait_log(&format!("XDP SynGate attached to {}", lab.srv_if));
    s.signal("KILL");
    s.wait_exit();
    drop(s);
    assert!(!lab.xdp_on_srv_if(), "program left after SIGKILL");
    assert!(pins.exists());
    assert_eq!(lab.sysctl("net.ipv4.tcp_syncookies"), "2");
    let mut s = Tlsgate::spawn(&lab, &fx, "", &xdp);
    s.wait_log(&format!("XDP SynGate attached to {}", lab.srv_if));
    assert!(
        s.log().contains("removed what a previous tlsgate left"),
        "{}",
        s.log()
    );
    fetch_hello(&lab);
    s.signal("TERM");
    assert!(s.wait_exit().success());
    drop(s);
    assert!(!lab.xdp_on_srv_if() && !pins.exists());
    assert_eq!(lab.sysctl("net.ipv4.tcp_syncookies"), before.0);

    // Cannot attach (always needs tcp_syncookies=2, not managed): exit 2
    // naming the sysctl ...
    let strict = format!("[xdp]\ninterface = \"{}\"\nmode = \"always\"\n", lab.srv_if);
    let mut s = Tlsgate::spawn(&lab, &fx, "", &strict);
    let status = s.wait_exit();
    assert_eq!(status.code(), Some(2), "{}", s.log());
    assert!(s.log().contains("net.ipv4.tcp_syncookies"), "{}", s.log());
    drop(s);
    // ... or, optional, serve unprotected and say so.
    let optional = format!("{strict}optional = true\n");
    let s = Tlsgate::spawn(&lab, &fx, "", &optional);
    s.wait_log(&format!("listening on https://[{SRV6}]:8443"));
    assert!(s.log().contains("SERVING UNPROTECTED"), "{}", s.log());
    assert!(!lab.xdp_on_srv_if());
    fetch_hello(&lab);
    assert_eq!(xdp_attached(&lab), Some(0.0));
}

/// SYNs of the sampled top sources (every answered SYN is sampled with
/// `--top-sample 1`) whose prefix starts with `start`.
fn top_syns(stats: &serde_json::Value, start: &str) -> u64 {
    stats["top_sources"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["prefix"].as_str().unwrap().starts_with(start))
        .map(|t| t["syns"].as_u64().unwrap())
        .sum()
}

/// tlsgate's own flood generator (AF_PACKET, batched, spoofed sources from
/// 10.254.2.1–8 and fd00:254:2::1–8, routed inside the namespaces) at
/// 50,000 SYN/s against `always`: clients keep getting through, over TLS,
/// during the flood; every SYN that reached the server's interface was seen
/// and answered, and the counters match what was sent per source.
#[test]
fn during_a_spoofed_flood_clients_keep_succeeding_and_counters_match() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use tlsgate_loadgen::synflood::{Inject, Sources, SynFlood};

    let lab = Lab::new("d");
    let fx = Fixture::new();
    let server = Tlsgate::start(&lab, &fx, "");
    ok(&mut lab.in_srv(&["ip", "route", "add", "10.254.2.0/24", "via", CLI4]));
    ok(&mut lab.in_srv(&["ip", "-6", "route", "add", "fd00:254:2::/64", "via", CLI6]));
    ok(&mut lab.tlsgate(&[
        "xdp",
        "attach",
        "--iface",
        &lab.srv_if,
        "--port",
        "8443",
        "--mode",
        "always",
        "--top-sample",
        "1",
        "--manage-sysctls",
    ]));
    let dropped_before = lab.cli_tx_dropped();
    let flood = |target: &str, first: &str, count: u64, options: bool, inject| SynFlood {
        iface: lab.cli_if.clone(),
        src_mac: Lab::mac(&lab.cli, &lab.cli_if),
        dst_mac: Lab::mac(&lab.srv, &lab.srv_if),
        target: target.parse().unwrap(),
        sources: Sources {
            first: first.parse().unwrap(),
            count: 8,
        },
        rate: Some(50_000),
        count: Some(count),
        duration: Duration::from_secs(20),
        options,
        batch: 64,
        inject,
        xdp_anchor: (inject == Inject::XdpLive).then(|| lab.anchor_if.clone()),
    };
    let netns = Some(PathBuf::from(format!("/run/netns/{}", lab.cli)));

    // AF_PACKET over IPv4 and IPv6, then the XDP injection (paced
    // xdp_frames, as a NIC delivers) over IPv4.
    let mut sent = [0u64; 3];
    for (k, (spec, check)) in [
        (
            flood(
                &format!("{SRV4}:8443"),
                "10.254.2.1",
                100_000,
                true,
                Inject::Packet,
            ),
            format!("https://{SRV4}:8443/big.bin"),
        ),
        (
            flood(
                &format!("[{SRV6}]:8443"),
                "fd00:254:2::1",
                40_000,
                false,
                Inject::Packet,
            ),
            format!("https://[{SRV6}]:8443/big.bin"),
        ),
        (
            flood(
                &format!("{SRV4}:8443"),
                "10.254.2.1",
                100_000,
                true,
                Inject::XdpLive,
            ),
            format!("https://{SRV4}:8443/big.bin"),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let stop = Arc::new(AtomicBool::new(false));
        let running = spec.spawn(netns.clone(), None, stop.clone()).unwrap();
        // Clients during the flood: every one must succeed.
        let mut fetched = 0;
        while !running.is_finished() {
            let args = curl_args(&check, &[]);
            let out = run(&mut lab.in_cli(&args.iter().map(String::as_str).collect::<Vec<_>>()));
            if running.is_finished() && fetched > 0 {
                break;
            }
            assert!(
                out.status.success() && out.stdout == fx.big,
                "a client failed during the flood: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            fetched += 1;
        }
        stop.store(true, Ordering::Relaxed);
        let report = running
            .join()
            .unwrap()
            .unwrap_or_else(|e| panic!("the flood generator failed: {e}"));
        eprintln!(
            "flood {k}: {} SYNs in {:?} ({:.0}/s), {fetched} × 1 MiB fetched meanwhile",
            report.sent,
            report.elapsed,
            report.rate()
        );
        assert!(fetched >= 2, "the flood ended before clients could try");
        sent[k] = report.sent;
    }
    assert_eq!(sent, [100_000, 40_000, 100_000]);

    let st = lab.stats();
    let (syns, cookies, passed, errors) = counters(&st);
    let dropped = lab.cli_tx_dropped() - dropped_before;
    let spoofed = [top_syns(&st, "10.254.2."), top_syns(&st, "fd00:254:2:")];
    let legit = top_syns(&st, "10.254.1.2/") + top_syns(&st, "fd00:254:1:");
    eprintln!("after the floods: {dropped} frames dropped by veth; {st}");
    assert_eq!(errors, 0, "{st}");
    assert_eq!(passed, 0, "{st}");
    assert_eq!(syns, cookies, "{st}");
    assert_eq!(syns, spoofed[0] + spoofed[1] + legit, "{st}");
    assert!(legit >= 4, "{st}");
    // Every SYN sent was seen and answered by XDP, but for those veth
    // dropped on the way (its drop count covers the clients' frames too).
    let seen = spoofed[0] + spoofed[1];
    let total: u64 = sent.iter().sum();
    assert!(
        seen <= total && seen + dropped >= total,
        "sent {sent:?}, seen {spoofed:?}, {dropped} dropped by veth: {st}"
    );
    drop(server);
}

/// `tlsgate bench synflood --quick` runs its four cells (kernel and XDP, no
/// flood and 50,000 SYN/s) in namespaces of its own and reports sane
/// figures: handshakes and transfers in every cell and no failure, the flood sent, XDP
/// cookies only with XDP, a CPU cost per SYN for both flooded cells; and
/// it leaves no namespace behind.
#[test]
fn bench_synflood_quick_reports_every_cell() {
    require_root();
    let out = tempfile::tempdir().unwrap();
    let bench = Command::new(bin())
        .args(["bench", "synflood", "--quick", "--out"])
        .arg(out.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The bench names its namespaces after its pid; other benches may run
    // beside this one (another checkout's tests), so only ours are checked.
    let pid = bench.id() % 100_000;
    let done = bench.wait_with_output().unwrap();
    let report = String::from_utf8_lossy(&done.stdout);
    assert!(
        done.status.success(),
        "bench synflood failed ({}):\n{report}{}",
        done.status,
        String::from_utf8_lossy(&done.stderr)
    );
    eprintln!("{report}");
    let svg = std::fs::read_to_string(out.path().join("synflood.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("XDP SynGate"), "{svg}");
    let text = std::fs::read_to_string(out.path().join("synflood.json")).unwrap();
    let cells: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    assert_eq!(cells.len(), 4, "{text}");
    for c in &cells {
        let flooded = c["target_rate"].as_u64() != Some(0);
        let xdp = c["mode"] == "xdp";
        assert!(c["handshakes_per_sec"].as_f64().unwrap() > 0.0, "{c}");
        assert!(c["transfer_mb_per_sec"].as_f64().unwrap() > 0.0, "{c}");
        assert_eq!(c["errors"], 0, "{c}");
        assert_eq!(flooded, c["flood_rate"].as_f64().unwrap() > 10_000.0, "{c}");
        assert_eq!(xdp, c["xdp_cookies"].as_u64().unwrap() > 0, "{c}");
        assert_eq!(flooded, c["cpu_per_syn_us"].is_number(), "{c}");
        // The steady load (a share of the kernel's no-flood maximum) was
        // offered in every cell and served.
        assert!(c["steady_offered"].as_f64().unwrap() >= 1.0, "{c}");
        assert!(c["steady_per_sec"].as_f64().unwrap() > 0.0, "{c}");
        assert_eq!(
            flooded,
            c["flood_only_received"].as_f64().unwrap() > 10_000.0,
            "{c}"
        );
    }
    let left = sh(&["ip", "netns", "list"]);
    assert!(
        !left.contains(&format!("tgbench-s-{pid}")) && !left.contains(&format!("tgbench-c-{pid}")),
        "namespaces left: {left}"
    );
}

/// A TCP sink for the server namespace (`python3 -c SINK PORT`): on
/// `[::]:PORT`, dual stack, it reads each connection to its end and answers
/// with the number of bytes read.
const SINK: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind(("::", int(sys.argv[1])))
s.listen(16)
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.settimeout(20)
    n = 0
    try:
        while True:
            b = c.recv(65536)
            if not b:
                break
            n += len(b)
        c.sendall(str(n).encode())
    except OSError:
        pass
    c.close()
"#;

/// An upload (`python3 -c UPLOAD HOST PORT BYTES`): connects, sends BYTES
/// zeros, reads the sink's count; prints `mss M reply N` (M: the send MSS
/// the client took from the SYN-ACK) or `mss M error E` and exits 1.
const UPLOAD: &str = r#"
import socket, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
s.settimeout(10)
s.connect((host, port))
mss = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
try:
    s.sendall(bytes(n))
    s.shutdown(socket.SHUT_WR)
    reply = s.recv(64).decode()
except OSError as e:
    print(f"mss {mss} error {e}")
    sys.exit(1)
print(f"mss {mss} reply {reply}")
"#;

/// A background process that is killed when dropped.
struct Bg(Child);

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts [`SINK`] on `port` in the server namespace and waits until it
/// listens.
fn sink(lab: &Lab, port: u16) -> Bg {
    use std::io::BufRead;
    let mut child = lab
        .in_srv(&["python3", "-c", SINK, &port.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready", "the sink did not start");
    Bg(child)
}

fn cookies_now(lab: &Lab) -> u64 {
    counters(&lab.stats()).1
}

/// The server's MTU is smaller than the client's (1400 against 1500, TSO
/// and GSO off on the client, so its segments leave as the MSS cuts
/// them): a 100 KB upload through an XDP cookie works over IPv4 and IPv6
/// only if the SYN-ACK advertises the server's own MSS (1360 and 1340)
/// rather than echoing the client's (1460 and 1440), whose full-sized
/// frames the server's interface drops.
#[test]
fn syn_ack_advertises_our_mss_so_uploads_fit_our_mtu() {
    let lab = Lab::new("m");
    lab.set_srv_mtu(1400);
    ok(&mut lab.in_cli(&["ethtool", "-K", &lab.cli_if, "tso", "off", "gso", "off"]));
    let _sink = sink(&lab, 9000);
    lab.attach_always(9000);
    // Our MSS less the 12 bytes of timestamps each segment carries.
    for (host, max_mss) in [(SRV4, 1400 - 40 - 12), (SRV6, 1400 - 60 - 12)] {
        let before = cookies_now(&lab);
        let out = run(&mut lab.in_cli(&["python3", "-c", UPLOAD, host, "9000", "100000"]));
        let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
        eprintln!("upload to {host}: {said}");
        assert!(
            out.status.success() && said.ends_with("reply 100000"),
            "100 KB upload to {host} through a cookie: {said} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mss: u32 = said
            .split_whitespace()
            .nth(1)
            .and_then(|m| m.parse().ok())
            .unwrap();
        assert!(
            mss <= max_mss,
            "the client sends {mss}-byte segments to {host}"
        );
        assert_eq!(cookies_now(&lab), before + 1, "answered from XDP");
    }
    let st = lab.stats();
    assert_eq!(st["mss_ipv4"], 1360, "{st}");
    assert_eq!(st["mss_ipv6"], 1340, "{st}");
}

/// With SACK or window scaling turned off on the server's host
/// (`net.ipv4.tcp_sack = 0` is the CVE-2019-11477 mitigation), the kernel
/// refuses a cookie ACK whose echoed timestamp says the option was agreed:
/// SynGate must neither offer it nor encode it. A Linux client (which
/// sends both) connects over IPv4 and IPv6 with each turned off.
#[test]
fn cookies_respect_sack_and_window_scaling_turned_off_on_the_host() {
    let lab = Lab::new("k");
    let fx = Fixture::new();
    let _server = Tlsgate::start(&lab, &fx, "");
    for knob in ["net.ipv4.tcp_sack", "net.ipv4.tcp_window_scaling"] {
        ok(&mut lab.in_srv(&["sysctl", "-qw", &format!("{knob}=0")]));
        lab.attach_always(8443);
        for url in [
            format!("https://{SRV4}:8443/hello.txt"),
            format!("https://[{SRV6}]:8443/hello.txt"),
        ] {
            let before = cookies_now(&lab);
            let args = curl_args(&url, &["--max-time", "10"]);
            let out = run(&mut lab.in_cli(&args.iter().map(String::as_str).collect::<Vec<_>>()));
            assert!(
                out.status.success() && out.stdout == HELLO.as_bytes(),
                "{url} with {knob}=0: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(cookies_now(&lab), before + 1, "{url}: answered from XDP");
        }
        ok(&mut lab.tlsgate(&["xdp", "detach", "--iface", &lab.srv_if]));
        ok(&mut lab.in_srv(&["sysctl", "-qw", &format!("{knob}=1")]));
    }
}

/// Sends one hand-made SYN (with an MSS option) from the client's
/// interface (`python3 -c RAW_SYN IF SRC_MAC DST_MAC SRC DST PORT [SKEW]`,
/// AF_PACKET) and watches that interface 1.5 s for the SYN-ACK: prints
/// `SYN-ACK from ADDR` or `no SYN-ACK`. SKEW is added to the IP length
/// field (IPv4 total length, IPv6 payload length), the frame left whole.
const RAW_SYN: &str = r#"
import random, socket, struct, sys, time
ifname, smac, dmac, src, dst, port = sys.argv[1:7]
skew = int(sys.argv[7]) if len(sys.argv) > 7 else 0
def mac(m):
    return bytes.fromhex(m.replace(":", ""))
def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF
sport = random.randint(20000, 60000)
opts = struct.pack("!BBH", 2, 4, 1460)
tcp = struct.pack("!HHIIBBHHH", sport, int(port), random.getrandbits(32), 0, 6 << 4, 0x02, 64240, 0, 0) + opts
if ":" in dst:
    sa, da = socket.inet_pton(socket.AF_INET6, src), socket.inet_pton(socket.AF_INET6, dst)
    tcp = tcp[:16] + struct.pack("!H", csum(sa + da + struct.pack("!IxxxB", len(tcp), 6) + tcp)) + tcp[18:]
    ip = struct.pack("!IHBB", 6 << 28, len(tcp) + skew, 6, 64) + sa + da
    etype = 0x86DD
else:
    sa, da = socket.inet_aton(src), socket.inet_aton(dst)
    tcp = tcp[:16] + struct.pack("!H", csum(sa + da + struct.pack("!BBH", 0, 6, len(tcp)) + tcp)) + tcp[18:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp) + skew, 0, 0x4000, 64, 6, 0, sa, da)
    ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
    etype = 0x0800
r = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
r.bind((ifname, 0))
r.settimeout(0.2)
r.send(mac(dmac) + mac(smac) + struct.pack("!H", etype) + ip + tcp)
deadline = time.time() + 1.5
while time.time() < deadline:
    try:
        f = r.recv(2048)
    except socket.timeout:
        continue
    et = struct.unpack("!H", f[12:14])[0]
    if et == 0x0800 and f[23] == 6:
        t, frm = 14 + (f[14] & 15) * 4, socket.inet_ntoa(f[26:30])
    elif et == 0x86DD and f[20] == 6:
        t, frm = 54, socket.inet_ntop(socket.AF_INET6, f[22:38])
    else:
        continue
    if struct.unpack("!H", f[t + 2 : t + 4])[0] == sport and f[t + 13] & 0x12 == 0x12:
        print("SYN-ACK from", frm)
        sys.exit(0)
print("no SYN-ACK")
"#;

fn raw_syn(lab: &Lab, dst_mac: &str, src: &str, dst: &str) -> String {
    raw_syn_skewed(lab, dst_mac, src, dst, 0)
}

/// [`raw_syn`] with `skew` added to the IP length field.
fn raw_syn_skewed(lab: &Lab, dst_mac: &str, src: &str, dst: &str, skew: i32) -> String {
    let smac = Lab::link(&lab.cli, &lab.cli_if)["address"]
        .as_str()
        .unwrap()
        .to_string();
    let out = ok(&mut lab.in_cli(&[
        "python3",
        "-c",
        RAW_SYN,
        &lab.cli_if,
        &smac,
        dst_mac,
        src,
        dst,
        "8443",
        &skew.to_string(),
    ]));
    out.trim().to_string()
}

/// tlsgate on wildcard listeners (which match any destination address)
/// with `always` on the server's interface: its MAC.
fn wildcard_lab(tag: &str) -> (Lab, Fixture, Tlsgate, String) {
    let lab = Lab::new(tag);
    let fx = Fixture::new();
    let server = Tlsgate::spawn_on(&lab, &fx, "\"0.0.0.0:8443\", \"[::]:8443\"", "", "");
    server.wait_log("listening on https://[::]:8443");
    lab.attach_always(8443);
    let srv_mac = Lab::link(&lab.srv, &lab.srv_if)["address"]
        .as_str()
        .unwrap()
        .to_string();
    (lab, fx, server, srv_mac)
}

/// SYNs that are not for this host (another destination MAC, broadcast)
/// reach the interface on a shared segment or in promiscuous mode; the
/// kernel ignores them, and so must SynGate: a wildcard listener matches
/// any destination address, so without a check SynGate would answer for
/// other hosts' addresses. A SYN to the server's MAC and address is
/// answered (the probe can see a SYN-ACK), and a client still connects.
#[test]
fn syns_for_other_hosts_get_no_syn_ack() {
    let (lab, _fx, server, srv_mac) = wildcard_lab("o");
    let foreign = "02:00:5e:00:53:01";
    assert_eq!(
        raw_syn(&lab, &srv_mac, CLI4, SRV4),
        format!("SYN-ACK from {SRV4}")
    );
    for (dst_mac, src, dst) in [
        (foreign, CLI4, "10.254.9.9"),
        (foreign, CLI6, "fd00:254:9::9"),
        (foreign, CLI4, SRV4),
        ("ff:ff:ff:ff:ff:ff", CLI4, SRV4),
        ("33:33:00:00:00:01", CLI6, SRV6),
    ] {
        assert_eq!(
            raw_syn(&lab, dst_mac, src, dst),
            "no SYN-ACK",
            "a SYN to {dst_mac} {dst}"
        );
    }
    fetch_hello(&lab);
    let st = lab.stats();
    let (syns, cookies, _, _) = counters(&st);
    assert_eq!((syns, cookies), (2, 2), "only the SYNs for us: {st}");
    drop(server);
}

/// One counter of the protected port.
fn counter(stats: &serde_json::Value, name: &str) -> u64 {
    stats["ports"][0]["counters"][name].as_u64().unwrap()
}

/// The normal SYNs over IPv4 and IPv6 get SYN-ACKs from XDP (the probe
/// can see one): two cookies.
fn normal_syns_are_answered(lab: &Lab, srv_mac: &str) {
    let before = cookies_now(lab);
    assert_eq!(
        raw_syn(lab, srv_mac, CLI4, SRV4),
        format!("SYN-ACK from {SRV4}")
    );
    assert_eq!(
        raw_syn(lab, srv_mac, CLI6, SRV6),
        format!("SYN-ACK from {SRV6}")
    );
    assert_eq!(cookies_now(lab), before + 2, "answered from XDP");
}

/// Sends each SYN of `cases` (source, destination, IP length skew) to the
/// server's MAC, between normal SYNs that must be answered: none of them
/// may get a SYN-ACK or move the cookie counter (every one that did is
/// listed), and each must be passed and counted under `reason`.
fn none_answered(lab: &Lab, srv_mac: &str, cases: &[(&str, &str, i32)], reason: &str) {
    normal_syns_are_answered(lab, srv_mac);
    let mut wrong = Vec::new();
    for &(src, dst, skew) in cases {
        let before = cookies_now(lab);
        let said = raw_syn_skewed(lab, srv_mac, src, dst, skew);
        let cookies = cookies_now(lab) - before;
        if said != "no SYN-ACK" || cookies != 0 {
            wrong.push(format!(
                "{src} -> {dst} (IP length {skew:+}): {said}, {cookies} cookies"
            ));
        }
    }
    assert!(wrong.is_empty(), "answered:\n{}", wrong.join("\n"));
    normal_syns_are_answered(lab, srv_mac);
    let st = lab.stats();
    let n = u64::try_from(cases.len()).unwrap();
    assert_eq!(counters(&st), (4 + n, 4, n, 0), "{st}");
    assert_eq!(counter(&st, reason), n, "{st}");
}

/// SYNs to the server's MAC from or to addresses the kernel drops on input
/// (martians: multicast, broadcast, loopback, unspecified, 0.0.0.0/8,
/// IPv4-mapped; a wildcard listener matches any destination) get no
/// SYN-ACK from XDP: they pass to the kernel, counted as `martian`, and
/// the kernel drops them. Normal SYNs before and after are answered.
#[test]
fn syns_from_or_to_martian_addresses_get_no_syn_ack() {
    let (lab, _fx, server, srv_mac) = wildcard_lab("ma");
    let cases = [
        ("224.0.0.1", SRV4, 0),
        ("239.1.2.3", SRV4, 0),
        ("255.255.255.255", SRV4, 0),
        ("127.0.0.1", SRV4, 0),
        ("0.0.0.0", SRV4, 0),
        ("0.1.2.3", SRV4, 0),
        ("ff02::1", SRV6, 0),
        ("ff0e::1", SRV6, 0),
        ("::1", SRV6, 0),
        ("::", SRV6, 0),
        ("::ffff:10.254.1.2", SRV6, 0),
        (CLI4, "255.255.255.255", 0),
        (CLI4, "224.0.0.1", 0),
        (CLI4, "127.0.0.1", 0),
        (CLI4, "0.0.0.0", 0),
        (CLI6, "ff02::1", 0),
        (CLI6, "::1", 0),
        (CLI6, "::ffff:10.254.1.1", 0),
    ];
    none_answered(&lab, &srv_mac, &cases, "martian");
    fetch_hello(&lab);
    drop(server);
}

/// SYNs whose IP length (IPv4 total length, IPv6 payload length) does
/// not cover the TCP header's options, which the frame still holds past
/// the datagram (as Ethernet padding), or none of the TCP header, or runs
/// past the end of the frame: the kernel drops them, so XDP answers none
/// (they pass, counted as `malformed`), and reads no option from padding.
#[test]
fn syns_whose_ip_length_misses_the_tcp_header_get_no_syn_ack() {
    let (lab, _fx, server, srv_mac) = wildcard_lab("ml");
    // The SYN's TCP header is 24 bytes: 20 and an MSS option.
    let cases = [
        (CLI4, SRV4, -4),
        (CLI4, SRV4, -24),
        (CLI4, SRV4, 100),
        (CLI6, SRV6, -4),
        (CLI6, SRV6, -24),
        (CLI6, SRV6, 100),
    ];
    none_answered(&lab, &srv_mac, &cases, "malformed");
    drop(server);
}

fn xdp_metrics_table(srv_if: &str) -> String {
    format!("[xdp]\ninterface = \"{srv_if}\"\nmode = \"always\"\nmanage_sysctls = true\n")
}

/// tlsgate serving as `nobody` after attaching (the pinned maps are root's,
/// 0600): /metrics still reports SynGate attached with its counters,
/// from the maps opened before privileges were dropped, and logs no
/// warning per scrape.
#[test]
fn metrics_keep_xdp_counters_after_dropping_privileges() {
    let lab = Lab::new("p");
    let fx = Fixture::new();
    let s = Tlsgate::spawn(
        &lab,
        &fx,
        "user = \"nobody\"",
        &xdp_metrics_table(&lab.srv_if),
    );
    s.wait_log(&format!("listening on https://[{SRV6}]:8443"));
    s.wait_log(&format!("XDP SynGate attached to {}", lab.srv_if));
    fetch_hello(&lab);
    fetch_hello(&lab);
    for _ in 0..2 {
        let m = metrics(&lab);
        let iface = format!("interface=\"{}\"", lab.srv_if);
        assert_eq!(
            metric(&m, &format!("tlsgate_xdp_attached{{{iface}}}")),
            Some(1.0),
            "{m}"
        );
        let cookies = metric(
            &m,
            &format!("tlsgate_xdp_cookies_total{{{iface},port=\"8443\"}}"),
        );
        assert!(cookies.is_some_and(|c| c >= 2.0), "{m}");
    }
    assert!(!s.log().contains("XDP stats for /metrics"), "{}", s.log());
}

/// `tlsgate xdp detach` and `attach` by hand against the interface a
/// running `tlsgate serve` holds: both refuse (exit 2, saying why) and
/// change nothing: the program, its pins, the sysctls, /metrics and the
/// cookies all stay.
#[test]
fn cli_refuses_to_detach_or_attach_under_a_running_serve() {
    let lab = Lab::new("h");
    let fx = Fixture::new();
    let mut s = Tlsgate::spawn(&lab, &fx, "", &xdp_metrics_table(&lab.srv_if));
    s.wait_log(&format!("listening on https://[{SRV6}]:8443"));
    s.wait_log(&format!("XDP SynGate attached to {}", lab.srv_if));
    let pins = PathBuf::from(tlsgate_xdp::PIN_ROOT).join(&lab.srv_if);
    let listing = || {
        let mut names: Vec<String> = std::fs::read_dir(&pins)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    let sysctls = || {
        (
            lab.sysctl("net.ipv4.tcp_syncookies"),
            lab.sysctl("net.ipv4.tcp_timestamps"),
        )
    };
    let (pins_before, sysctls_before) = (listing(), sysctls());
    assert_eq!(pins_before.len(), 6, "{pins_before:?}");
    assert_eq!(sysctls_before.0, "2");

    for mut cmd in [
        lab.tlsgate(&["xdp", "detach", "--iface", &lab.srv_if]),
        lab.attach_always_cmd(8443),
    ] {
        let args = format!("{cmd:?}");
        let out = run(&mut cmd);
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("{args}: {said}");
        assert_eq!(out.status.code(), Some(2), "{args}: {said}");
        assert!(
            said.contains("attached") && !said.contains("detached"),
            "{said}"
        );
        assert_eq!(listing(), pins_before, "after {args}");
        assert_eq!(sysctls(), sysctls_before, "after {args}");
        assert!(lab.xdp_on_srv_if());
        let before = cookies_now(&lab);
        fetch_hello(&lab);
        assert_eq!(cookies_now(&lab), before + 1, "still answered from XDP");
        assert_eq!(xdp_attached(&lab), Some(1.0));
    }
    s.signal("TERM");
    assert!(s.wait_exit().success(), "{}", s.log());
    assert!(!lab.xdp_on_srv_if() && !pins.exists());
}

/// The host's receive buffers and the interface's MTU lowered under a
/// running tlsgate: at SIGHUP it reads them again, so SynGate advertises
/// the window scale the kernel now gives a cookie socket and the MSS of the
/// new MTU, not the larger ones read at start.
#[test]
fn sighup_rereads_the_window_scale_and_mss() {
    let lab = Lab::new("r");
    let fx = Fixture::new();
    let data = ten_mib(&fx);
    // The scale comes from max(tcp_rmem[2], net.core.rmem_max); rmem_max
    // is global, so the test raises tcp_rmem above it, then lowers it.
    let rmem_max: i64 = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let high = rmem_max.max(1 << 20) * 8;
    let (start, after) = (
        tlsgate_xdp::sysctl::wscale_for(high),
        tlsgate_xdp::sysctl::wscale_for(rmem_max.max(4096)),
    );
    assert_ne!(start, after, "the test cannot move the window scale");
    let rmem = |max: i64| format!("net.ipv4.tcp_rmem=4096 131072 {max}");
    ok(&mut lab.in_srv(&["sysctl", "-qw", &rmem(high)]));
    let mut s = Tlsgate::spawn(&lab, &fx, "", &xdp_metrics_table(&lab.srv_if));
    s.wait_log(&format!("listening on https://[{SRV6}]:8443"));
    s.wait_log(&format!("XDP SynGate attached to {}", lab.srv_if));
    let st = lab.stats();
    assert_eq!(
        (st["wscale"].as_u64(), st["mss_ipv4"].as_u64()),
        (Some(u64::from(start)), Some(1460)),
        "{st}"
    );

    ok(&mut lab.in_srv(&["sysctl", "-qw", &rmem(rmem_max.max(4096))]));
    lab.set_srv_mtu(1400);
    s.signal("HUP");
    s.wait_log("reloaded configuration");
    let st = lab.stats();
    eprintln!("after SIGHUP: {st}");
    assert_eq!(st["wscale"].as_u64(), Some(u64::from(after)), "{st}");
    assert!(
        s.log().contains("XDP SynGate now advertises"),
        "{}",
        s.log()
    );
    assert_eq!(
        (st["mss_ipv4"].as_u64(), st["mss_ipv6"].as_u64()),
        (Some(1360), Some(1340)),
        "{st}"
    );

    // A connection through a cookie: the kernel's receive scale is the
    // one advertised.
    let before = cookies_now(&lab);
    let info = slow_fetch_socket_info(&lab, &data);
    assert_eq!(rcv_wscale(&info), Some(u64::from(after)), "{info}");
    assert_eq!(cookies_now(&lab), before + 1);
    s.signal("TERM");
    assert!(s.wait_exit().success(), "{}", s.log());
}

/// The interface SynGate is attached to deleted under a running tlsgate
/// (`ip link del`): the kernel detaches the program, and /metrics,
/// `tlsgate xdp stats` and the log say so (one warning naming the
/// interface). An interface of the same name made again gets SynGate back
/// at SIGHUP, with the new interface's MAC, and its SYNs are answered from
/// XDP again.
#[test]
fn a_deleted_interface_is_reported_detached_and_sighup_reattaches() {
    let lab = Lab::new("d");
    let fx = Fixture::new();
    let mut s = Tlsgate::spawn(&lab, &fx, "", &xdp_metrics_table(&lab.srv_if));
    s.wait_log(&format!("listening on https://[{SRV6}]:8443"));
    s.wait_log(&format!("XDP SynGate attached to {}", lab.srv_if));
    fetch_hello(&lab);
    assert_eq!(xdp_attached(&lab), Some(1.0));

    sh(&["ip", "-n", &lab.srv, "link", "del", &lab.srv_if]);
    let warning = format!("XDP SynGate on {} is detached", lab.srv_if);
    let deadline = Instant::now() + Duration::from_secs(5);
    while xdp_attached(&lab) != Some(0.0) {
        assert!(
            Instant::now() < deadline,
            "/metrics still says attached after `ip link del {}`:\n{}",
            lab.srv_if,
            metrics(&lab)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let st = lab.stats();
    eprintln!("stats after ip link del: {st}");
    assert_eq!(st["attached"], serde_json::json!(false), "{st}");
    assert!(
        st["link"].as_str().unwrap().contains("interface is gone"),
        "{st}"
    );
    let table = ok(&mut lab.tlsgate(&["xdp", "stats", "--iface", &lab.srv_if]));
    assert!(table.contains("detached"), "{table}");
    s.wait_log(&warning);
    // Once, not per scrape or per second.
    std::thread::sleep(Duration::from_millis(2500));
    let _ = metrics(&lab);
    assert_eq!(s.log().matches(&warning).count(), 1, "{}", s.log());

    // The same name again: SIGHUP attaches SynGate to the new interface.
    lab.add_pair();
    assert_eq!(xdp_attached(&lab), Some(0.0), "a new interface is not ours");
    let st = lab.stats();
    assert!(
        st["link"].as_str().unwrap().contains("has no SynGate"),
        "{st}"
    );
    s.signal("HUP");
    s.wait_log(&format!("XDP SynGate attached again to {}", lab.srv_if));
    assert_eq!(xdp_attached(&lab), Some(1.0));
    assert!(lab.xdp_on_srv_if());
    assert_eq!(lab.stats()["attached"], serde_json::json!(true));
    let before = cookies_now(&lab);
    fetch_hello(&lab);
    assert_eq!(cookies_now(&lab), before + 1, "answered from XDP again");
    s.signal("TERM");
    assert!(s.wait_exit().success(), "{}", s.log());
    assert!(!lab.xdp_on_srv_if());
}

/// A device whose driver has no native XDP (a bridge, Ethernet): a start
/// with `[xdp]` on it (native, the default) stops with an error that names
/// the interface and the mode and says how to ask for generic mode; so
/// does `tlsgate xdp attach`. With `generic = true` it attaches. `lo` is
/// refused in any mode, naming it: it is not Ethernet.
#[test]
fn native_attach_without_driver_support_says_to_use_generic_mode() {
    let lab = Lab::new("n");
    let fx = Fixture::new();
    let bridge = format!("tgnb{}", std::process::id() % 1_000_000);
    sh(&[
        "ip", "-n", &lab.srv, "link", "add", &bridge, "type", "bridge",
    ]);
    sh(&["ip", "-n", &lab.srv, "link", "set", &bridge, "up"]);
    let table = |iface: &str| {
        format!("[xdp]\ninterface = \"{iface}\"\nmode = \"always\"\nmanage_sysctls = true\n")
    };
    let mut s = Tlsgate::spawn(&lab, &fx, "", &table(&bridge));
    let status = s.wait_exit();
    let log = s.log();
    eprintln!("{log}");
    assert_eq!(status.code(), Some(2), "{log}");
    for needed in [
        format!("attach XDP to {bridge}"),
        "native (driver) mode".to_string(),
        "generic = true".to_string(),
    ] {
        assert!(log.contains(&needed), "no {needed:?} in:\n{log}");
    }
    drop(s);
    assert!(!PathBuf::from(tlsgate_xdp::PIN_ROOT).join(&bridge).exists());

    let out = run(&mut lab.tlsgate(&[
        "xdp",
        "attach",
        "--iface",
        &bridge,
        "--port",
        "8443",
        "--mode",
        "always",
        "--manage-sysctls",
    ]));
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("tlsgate xdp attach --iface {bridge}: {said}");
    assert_eq!(out.status.code(), Some(2), "{said}");
    for needed in [bridge.as_str(), "native (driver) mode", "--generic"] {
        assert!(said.contains(needed), "no {needed:?} in: {said}");
    }

    let mut s = Tlsgate::spawn(&lab, &fx, "", &table("lo"));
    assert_eq!(s.wait_exit().code(), Some(2), "{}", s.log());
    assert!(s.log().contains("lo is not Ethernet"), "{}", s.log());
    drop(s);

    let generic = format!("{}generic = true\n", table(&bridge));
    let s = Tlsgate::spawn(&lab, &fx, "", &generic);
    s.wait_log(&format!("XDP SynGate attached to {bridge}"));
    let m = metrics(&lab);
    assert_eq!(
        metric(
            &m,
            &format!("tlsgate_xdp_attached{{interface=\"{bridge}\"}}")
        ),
        Some(1.0),
        "{m}"
    );
    drop(s);
    let _ = std::fs::remove_dir_all(PathBuf::from(tlsgate_xdp::PIN_ROOT).join(&bridge));
}
