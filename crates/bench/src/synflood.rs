//! `tlsgate bench synflood`: legitimate TLS handshakes per second while a
//! spoofed SYN flood hits the server, from no flood up to the generator's
//! maximum, with the kernel answering the SYNs alone and with XDP SynGate
//! answering them, and the server core's CPU over the same windows.
//!
//! Everything runs between two network namespaces this bench creates,
//! joined by a veth pair; the flood's spoofed sources (10.254.2.0/24) are
//! routed inside them and nowhere else. The server namespace holds tlsgate
//! (one worker, pinned to the server core); this process moves into the
//! client namespace and runs the flood generator and the handshake
//! generator there, on the client core.
//!
//! On veth the receive side runs on the sender's core: a flood would bill
//! the server's packet work to the generator. Both veth ends therefore run
//! their NAPI in a kernel thread (`/sys/class/net/IF/threaded`), the
//! server end's pinned to the server core and the client end's to the
//! client core, as a NIC's interrupt would land on the server; the report
//! gives the server NAPI thread's CPU and the server core's busy share so
//! that this can be checked.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tlsgate_loadgen::synflood::{Inject, Sources, SynFlood};
use tlsgate_loadgen::{
    run_handshakes, run_transfer, HandshakeJob, Observer, Pacing, TlsProfile, TransferJob, Window,
};

use crate::materials::{Materials, SERVER_NAME};
use crate::proc::CoreTicks;
use crate::BenchError;

const SRV4: &str = "10.254.1.1";
const CLI4: &str = "10.254.1.2";
const PORT: u16 = 8443;

/// All legitimate load comes from one address: tlsgate's own handshake
/// flood limits would measure themselves (as in the other scenarios).
const LIMITS: &str = "[limits]\nmax_connections = 100000\nmax_connections_per_ip = 100000\nhandshake_rate_per_source = 0\nmax_handshakes_per_source = 0\nmax_handshakes_in_progress = 0\n";

/// What to measure.
#[derive(Debug, Clone)]
pub struct SynfloodOptions {
    /// The tlsgate binary.
    pub tlsgate: PathBuf,
    /// Flood rates in SYN/s; `None` is the generator's maximum.
    pub rates: Vec<Option<u64>>,
    /// Warm-up and measurement of every cell.
    pub window: Window,
    /// The server's core (tlsgate and the server end's NAPI thread).
    pub server_core: usize,
    /// The client's core (both generators and the client end's NAPI).
    pub client_core: usize,
    /// Handshakes in flight.
    pub concurrency: usize,
    /// How the flood generator sends, in every cell: `xdp_frame`s from
    /// an XDP program run with `BPF_PROG_RUN` (the default: the server's
    /// veth gets frames as a NIC driver hands them over, with XDP headroom
    /// and no skb, so the kernel path builds its skbs on the server's core
    /// and the XDP path copies nothing), or `AF_PACKET` skbs (built on the
    /// generator's core; veth copies each before XDP sees it). See the
    /// loadgen's [`Inject`].
    pub inject: Inject,
    /// The steady legitimate load, as a share of the kernel's no-flood
    /// maximum handshake rate (the talk's setup: the server is not
    /// CPU-bound by its legitimate traffic, ~40 % busy).
    pub steady_share: f64,
}

impl SynfloodOptions {
    /// The full run (`quick`: seconds, two rates).
    pub fn new(tlsgate: PathBuf, quick: bool) -> Self {
        let (rates, window) = if quick {
            (
                vec![Some(0), Some(50_000)],
                Window {
                    warmup: Duration::from_millis(300),
                    measure: Duration::from_secs(1),
                },
            )
        } else {
            (
                vec![
                    Some(0),
                    Some(25_000),
                    Some(50_000),
                    Some(100_000),
                    Some(200_000),
                    Some(400_000),
                    Some(800_000),
                    None,
                ],
                Window {
                    warmup: Duration::from_secs(1),
                    measure: Duration::from_secs(5),
                },
            )
        };
        Self {
            tlsgate,
            rates,
            window,
            server_core: 0,
            client_core: 1,
            concurrency: 8,
            inject: Inject::XdpLive,
            steady_share: 0.4,
        }
    }
}

/// One cell: a mode and a flood rate.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FloodCell {
    /// `kernel` or `xdp`.
    pub mode: &'static str,
    /// The rate asked for (SYN/s), `None` for the maximum.
    pub target_rate: Option<u64>,
    /// The rate the generator reached over the whole cell.
    pub flood_rate: f64,
    /// Legitimate TLS 1.3 handshakes (with a 1 KiB GET) per second.
    pub handshakes_per_sec: f64,
    /// Legitimate transfer throughput, MB/s: keep-alive GETs of 1 MiB over
    /// 4 connections, measured after the handshakes (the flood still on).
    pub transfer_mb_per_sec: f64,
    /// Failed legitimate connections in the window.
    pub errors: u64,
    /// The steady legitimate load's offered rate, handshakes/s (the same in
    /// every cell: a share of the kernel's no-flood maximum).
    pub steady_offered: f64,
    /// Steady load: handshakes (with a 1 KiB GET) completed per second.
    pub steady_per_sec: f64,
    /// Steady load: failed or refused (too many in flight) connections.
    pub steady_errors: u64,
    /// Steady load: 99th percentile of connect + handshake + GET, ms
    /// (counted from the scheduled start).
    pub steady_p99_ms: f64,
    /// The first failure's message.
    pub first_error: Option<String>,
    /// Busy share of the server core over the window.
    pub server_core_busy: f64,
    /// CPU seconds of the server end's NAPI thread in the window.
    pub napi_cpu_secs: f64,
    /// NET_RX softirqs per second on the server core and on the client
    /// core in the window (`/proc/softirqs`): with threaded NAPI the
    /// packets are polled in the NAPI threads instead, so these stay low
    /// on both, and `napi_cpu_secs` is where the server's share shows.
    pub net_rx_per_sec: [f64; 2],
    /// Busy share of the client core (the generators').
    pub client_core_busy: f64,
    /// Frames the client end of the veth pair dropped on the way to the
    /// server end over the whole cell (its receive ring was full): flood and
    /// legitimate frames alike.
    pub veth_dropped: u64,
    /// SYNs answered from XDP in the window (xdp mode).
    pub xdp_cookies: u64,
    /// Busy share of the server core with the flood alone (no legitimate
    /// load), measured right after the window.
    pub flood_only_busy: f64,
    /// CPU seconds per second of the server's packet work with the flood
    /// alone: its NAPI thread, tlsgate's threads and the server core's
    /// softirq time (timers: SYN-ACK retransmissions). Unlike the core's
    /// busy share, not inflated by other work on a shared machine.
    pub flood_only_server_cpu: f64,
    /// Frames per second the server's interface received with the flood
    /// alone (its SYNs, minus what veth dropped on the way).
    pub flood_only_received: f64,
    /// Server CPU per SYN received, µs: `flood_only_server_cpu` above the
    /// same mode's no-flood cell, divided by `flood_only_received`.
    pub cpu_per_syn_us: Option<f64>,
}

fn sh(args: &[&str]) -> Result<String, BenchError> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| BenchError::Other(format!("cannot run {}: {e}", args[0])))?;
    if !out.status.success() {
        return Err(BenchError::Other(format!(
            "{} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The two namespaces and the veth pair; removed when dropped.
struct Lab {
    srv: String,
    cli: String,
    srv_if: String,
    cli_if: String,
    /// One end of an idle veth pair in the client namespace: the flood
    /// generator's XDP program is attached there (see
    /// `SynFlood::xdp_anchor`).
    anchor_if: String,
}

impl Lab {
    fn new(o: &SynfloodOptions) -> Result<Lab, BenchError> {
        let id = std::process::id() % 100_000;
        let lab = Lab {
            srv: format!("tgbench-s-{id}"),
            cli: format!("tgbench-c-{id}"),
            srv_if: format!("sfs{id}"),
            cli_if: format!("sfc{id}"),
            anchor_if: format!("sfa{id}"),
        };
        let (s, c) = (lab.srv.as_str(), lab.cli.as_str());
        sh(&["ip", "netns", "add", s])?;
        sh(&["ip", "netns", "add", c])?;
        sh(&[
            "ip",
            "link",
            "add",
            &lab.srv_if,
            "type",
            "veth",
            "peer",
            "name",
            &lab.cli_if,
        ])?;
        sh(&["ip", "link", "set", &lab.srv_if, "netns", s])?;
        sh(&["ip", "link", "set", &lab.cli_if, "netns", c])?;
        for (ns, ifname, addr) in [(s, &lab.srv_if, SRV4), (c, &lab.cli_if, CLI4)] {
            sh(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                ifname,
            ])?;
            sh(&["ip", "-n", ns, "link", "set", ifname, "up"])?;
            sh(&["ip", "-n", ns, "link", "set", "lo", "up"])?;
            sh(&[
                "ip", "netns", "exec", ns, "ethtool", "-K", ifname, "tx", "off", "gro", "on",
            ])?;
            // NAPI in a kernel thread, pinned (see the module's comment).
            sh(&[
                "ip",
                "netns",
                "exec",
                ns,
                "sh",
                "-c",
                &format!("echo 1 > /sys/class/net/{ifname}/threaded"),
            ])?;
        }
        lab.pin_napi(o)?;
        sh(&[
            "ip",
            "-n",
            c,
            "link",
            "add",
            &lab.anchor_if,
            "type",
            "veth",
            "peer",
            "name",
            &format!("sfb{id}"),
        ])?;
        sh(&["ip", "-n", s, "route", "add", "10.254.2.0/24", "via", CLI4])?;
        // The client end needs an XDP program for XDP_TX frames to arrive;
        // bench_sink also drops the SYN-ACKs to the spoofed sources there
        // (a real flood's go out to the Internet, not to the generators'
        // core).
        let obj = std::env::temp_dir().join(format!("tlsgate-bench-{id}.bpf.o"));
        std::fs::write(&obj, tlsgate_xdp::SINK_OBJECT).map_err(BenchError::io(&obj))?;
        let attached = sh(&[
            "ip",
            "-n",
            c,
            "link",
            "set",
            "dev",
            &lab.cli_if,
            "xdpdrv",
            "obj",
            &obj.to_string_lossy(),
            "sec",
            "xdp",
            "program",
            "bench_sink",
        ]);
        let _ = std::fs::remove_file(&obj);
        attached?;
        if napi_threads(&lab.srv_if).is_empty() {
            return Err(BenchError::Other(format!(
                "no NAPI thread for {}: threaded NAPI did not take",
                lab.srv_if
            )));
        }
        Ok(lab)
    }

    /// Pins the NAPI threads of both ends (again: attaching XDP may make
    /// new ones) and gives them a real-time priority: a NIC's interrupt
    /// raises a softirq that runs before any task on that core, whereas a
    /// NAPI thread under the default policy waits its turn behind tlsgate
    /// and the generators, milliseconds on a busy core, while veth's
    /// 256-frame ring overflows (measured: 3/4 of a 100k SYN/s flood
    /// dropped there, legitimate SYNs among them, at a server core only
    /// 12 % busy with it).
    fn pin_napi(&self, o: &SynfloodOptions) -> Result<(), BenchError> {
        for (ifname, core) in [(&self.srv_if, o.server_core), (&self.cli_if, o.client_core)] {
            for pid in napi_threads(ifname) {
                let pid = pid.to_string();
                sh(&["taskset", "-pc", &core.to_string(), &pid])?;
                sh(&["chrt", "-f", "-p", "50", &pid])?;
            }
        }
        Ok(())
    }

    fn mac(&self, ns: &str, ifname: &str) -> Result<[u8; 6], BenchError> {
        let out = sh(&["ip", "-n", ns, "-o", "link", "show", "dev", ifname])?;
        let text = out
            .split("link/ether ")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .ok_or_else(|| BenchError::Other(format!("no MAC address for {ifname}")))?;
        let mut mac = [0u8; 6];
        for (m, part) in mac.iter_mut().zip(text.split(':')) {
            *m = u8::from_str_radix(part, 16)
                .map_err(|_| BenchError::Other(format!("bad MAC address {text}")))?;
        }
        Ok(mac)
    }

    fn tlsgate(&self, bin: &Path, args: &[&str]) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.srv))
            .arg(bin)
            .args(args);
        c
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.srv])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.cli])
            .output();
        let _ = std::fs::remove_dir_all(Path::new(tlsgate_xdp::PIN_ROOT).join(&self.srv_if));
    }
}

/// Frames an interface in a namespace could not hand to its veth peer
/// (the peer's receive ring was full): skbs, counted as TX drops (`ip -s`),
/// and xdp_frames, counted per queue as `xdp_xmit_errors` (`ethtool -S`).
fn tx_dropped(ns: &str, ifname: &str) -> u64 {
    let skbs = sh(&["ip", "-n", ns, "-j", "-s", "link", "show", "dev", ifname])
        .ok()
        .and_then(|out| serde_json::from_str::<serde_json::Value>(&out).ok())
        .and_then(|v| v[0]["stats64"]["tx"]["dropped"].as_u64())
        .unwrap_or(0);
    let frames: u64 = sh(&["ip", "netns", "exec", ns, "ethtool", "-S", ifname])
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().split_once(':'))
        .filter(|(k, _)| k.ends_with("xdp_xmit_errors"))
        .filter_map(|(_, v)| v.trim().parse::<u64>().ok())
        .sum();
    skbs + frames
}

/// Frames an interface has received, read from `/proc/PID/net/dev` of a
/// process in its namespace.
fn rx_packets(pid: u32, ifname: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/net/dev"))
        .ok()
        .and_then(|text| {
            text.lines().find_map(|l| {
                l.trim_start()
                    .strip_prefix(&format!("{ifname}:"))
                    .map(str::to_owned)
            })
        })
        .and_then(|rest| rest.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

/// The NAPI kernel threads of an interface (`napi/IF-ID`).
fn napi_threads(ifname: &str) -> Vec<u32> {
    let prefix = format!("napi/{ifname}-");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim_end().starts_with(&prefix))
        })
        .collect()
}

/// CPU seconds of a thread or process so far (utime + stime).
fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces).
    let rest = stat.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15; `rest` starts at field 3.
    (ticks(11) + ticks(12)) / 100.0
}

/// Softirq time of one core so far, seconds (/proc/stat, USER_HZ = 100).
fn softirq_secs(core: usize) -> f64 {
    let name = format!("cpu{core}");
    std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|stat| {
            stat.lines()
                .find(|l| l.split_whitespace().next() == Some(name.as_str()))
                .and_then(|l| l.split_whitespace().nth(7)?.parse::<f64>().ok())
        })
        .map_or(0.0, |t| t / 100.0)
}

/// The server's packet work so far, CPU seconds: NAPI threads, tlsgate,
/// the server core's softirqs.
fn server_cpu_secs(napi: &[u32], tlsgate: u32, core: usize) -> f64 {
    napi.iter().map(|p| cpu_secs(*p)).sum::<f64>() + cpu_secs(tlsgate) + softirq_secs(core)
}

/// Samples the server side at the window's edges.
struct Sampler {
    server_core: usize,
    client_core: usize,
    napi: Vec<u32>,
    at: std::sync::Mutex<Vec<Sample>>,
}

/// The server core, the client core, the server NAPI threads' CPU seconds,
/// and NET_RX softirqs run on each of the two cores.
type Sample = (CoreTicks, CoreTicks, f64, [u64; 2]);

/// NET_RX softirqs each core has run so far (`/proc/softirqs`).
fn net_rx_softirqs(cores: [usize; 2]) -> [u64; 2] {
    let text = std::fs::read_to_string("/proc/softirqs").unwrap_or_default();
    let counts: Vec<u64> = text
        .lines()
        .find(|l| l.trim_start().starts_with("NET_RX:"))
        .map(|l| {
            l.split_whitespace()
                .skip(1)
                .filter_map(|v| v.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    cores.map(|c| counts.get(c).copied().unwrap_or(0))
}

impl Sampler {
    fn sample(&self) {
        let s = (
            CoreTicks::now(self.server_core).unwrap_or_default(),
            CoreTicks::now(self.client_core).unwrap_or_default(),
            self.napi.iter().map(|p| cpu_secs(*p)).sum(),
            net_rx_softirqs([self.server_core, self.client_core]),
        );
        self.at.lock().unwrap_or_else(|e| e.into_inner()).push(s);
    }
}

impl Observer for Sampler {
    fn window_opened(&self) {
        self.sample();
    }
    fn window_closed(&self) {
        self.sample();
    }
}

struct Server {
    child: Child,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

fn start_server(lab: &Lab, o: &SynfloodOptions, m: &Materials) -> Result<Server, BenchError> {
    let config = format!(
        "[server]\nworkers = 1\n\n[admin]\nlisten = \"\"\n\n[access_log]\ntarget = \"off\"\n\n{LIMITS}\n[[listener]]\nlisten = [\"{SRV4}:{PORT}\"]\nroot = {root:?}\n\n[[listener.certificate]]\ncert = {cert:?}\nkey = {key:?}\n",
        root = m.root,
        cert = m.ecdsa.cert,
        key = m.ecdsa.key,
    );
    let path = m.dir().join("synflood.toml");
    std::fs::write(&path, config).map_err(BenchError::io(&path))?;
    let log = m.dir().join("synflood-tlsgate.log");
    let file = std::fs::File::create(&log).map_err(BenchError::io(&log))?;
    let core = o.server_core.to_string();
    let mut c = Command::new("nsenter");
    c.arg(format!("--net=/run/netns/{}", lab.srv))
        .args(["taskset", "-c", &core])
        .arg(&o.tlsgate)
        .args(["serve", "--config", &path.to_string_lossy()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(file);
    let child = c
        .spawn()
        .map_err(|e| BenchError::Other(format!("cannot start tlsgate: {e}")))?;
    let server = Server { child };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("listening on https://") {
            return Ok(server);
        }
        if Instant::now() > deadline {
            return Err(BenchError::Target {
                target: "tlsgate".into(),
                problem: "did not listen within 20 s".into(),
                log: text,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn xdp_cookies(iface: &str) -> u64 {
    tlsgate_xdp::stats(Path::new(tlsgate_xdp::PIN_ROOT), iface)
        .map(|s| s.ports.iter().map(|p| p.counters.cookies).sum())
        .unwrap_or(0)
}

/// Runs every cell: kernel only, then with SynGate attached (`always`).
pub fn run(o: &SynfloodOptions) -> Result<Vec<FloodCell>, BenchError> {
    let materials = Materials::create()?;
    let path = materials.file(1 << 10)?;
    let big = materials.file(1 << 20)?;
    let lab = Lab::new(o)?;
    let server = start_server(&lab, o, &materials)?;
    let server_pid = server.child.id();
    let src_mac = lab.mac(&lab.cli, &lab.cli_if)?;
    let dst_mac = lab.mac(&lab.srv, &lab.srv_if)?;
    // From here on this thread, and every thread it starts, is in the
    // client namespace.
    let ns = std::fs::File::open(format!("/run/netns/{}", lab.cli))
        .map_err(BenchError::io(format!("/run/netns/{}", lab.cli)))?;
    let home =
        std::fs::File::open("/proc/self/ns/net").map_err(BenchError::io("/proc/self/ns/net"))?;
    let enter = |f: &std::fs::File| {
        rustix::thread::move_into_link_name_space(
            std::os::fd::AsFd::as_fd(f),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .map_err(|e| BenchError::Other(format!("setns: {e}")))
    };
    enter(&ns)?;
    let result = (|| {
        let mut cells = Vec::new();
        // Set by the first cell (the kernel's, without a flood).
        let mut steady_rate = None;
        for mode in ["kernel", "xdp"] {
            if mode == "xdp" {
                let out = lab
                    .tlsgate(
                        &o.tlsgate,
                        &[
                            "xdp",
                            "attach",
                            "--iface",
                            &lab.srv_if,
                            "--port",
                            "8443",
                            "--mode",
                            "always",
                            "--manage-sysctls",
                        ],
                    )
                    .output()
                    .map_err(|e| BenchError::Other(format!("tlsgate xdp attach: {e}")))?;
                if !out.status.success() {
                    return Err(BenchError::Other(format!(
                        "tlsgate xdp attach: {}",
                        String::from_utf8_lossy(&out.stderr)
                    )));
                }
            }
            // Let the previous mode's half-open connections and queues
            // settle before the no-flood cell.
            std::thread::sleep(Duration::from_secs(2));
            let mut idle_cpu = None;
            for rate in &o.rates {
                let cell = run_cell(
                    o,
                    &lab,
                    Cell {
                        mode,
                        rate: *rate,
                        idle_cpu,
                        steady: steady_rate,
                    },
                    src_mac,
                    dst_mac,
                    (&path, &big),
                    server_pid,
                )?;
                if *rate == Some(0) {
                    idle_cpu = Some(cell.flood_only_server_cpu);
                }
                steady_rate = Some(cell.steady_offered);
                eprintln!(
                    "synflood {mode:>6} {:>8}: {:>9.0} SYN/s, {:>7.0} handshakes/s, {:>6.0} MB/s, steady {:>5.0} of {:.0}/s (p99 {:.1} ms), server core {:>5.1} %, {} µs/SYN",
                    rate.map_or("max".to_string(), |r| r.to_string()),
                    cell.flood_rate,
                    cell.handshakes_per_sec,
                    cell.transfer_mb_per_sec,
                    cell.steady_per_sec,
                    cell.steady_offered,
                    cell.steady_p99_ms,
                    cell.server_core_busy * 100.0,
                    cell.cpu_per_syn_us.map_or("–".into(), |v| format!("{v:.2}")),
                );
                cells.push(cell);
            }
        }
        Ok(cells)
    })();
    let _ = lab
        .tlsgate(&o.tlsgate, &["xdp", "detach", "--iface", &lab.srv_if])
        .output();
    enter(&home)?;
    result
}

/// What one cell measures.
struct Cell {
    mode: &'static str,
    /// SYN/s, `None` for the generator's maximum.
    rate: Option<u64>,
    /// The same mode's server CPU without a flood (its first cell's).
    idle_cpu: Option<f64>,
    /// The steady load's rate; `None`: derive it from this cell.
    steady: Option<f64>,
}

fn run_cell(
    o: &SynfloodOptions,
    lab: &Lab,
    cell: Cell,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    (path, big): (&str, &str),
    server_pid: u32,
) -> Result<FloodCell, BenchError> {
    let Cell {
        mode,
        rate,
        idle_cpu,
        steady,
    } = cell;
    lab.pin_napi(o)?;
    let stop = Arc::new(AtomicBool::new(false));
    let dropped_before = tx_dropped(&lab.cli, &lab.cli_if);
    let flood_only = o.window.measure.min(Duration::from_secs(2));
    let transfer_window = Window {
        warmup: o.window.warmup.min(Duration::from_millis(500)),
        measure: (o.window.measure / 2).max(Duration::from_secs(1)),
    };
    let total = 2 * (o.window.warmup + o.window.measure)
        + transfer_window.warmup
        + transfer_window.measure
        + flood_only
        + Duration::from_secs(2);
    let flood = match rate {
        Some(0) => None,
        _ => Some(
            SynFlood {
                iface: lab.cli_if.clone(),
                src_mac,
                dst_mac,
                target: format!("{SRV4}:{PORT}")
                    .parse()
                    .map_err(|_| BenchError::Other("target address".into()))?,
                sources: Sources {
                    first: "10.254.2.1"
                        .parse()
                        .map_err(|_| BenchError::Other("source address".into()))?,
                    count: 250,
                },
                rate,
                count: None,
                duration: total,
                options: true,
                // Frames per sendmmsg, or per batch inside a BPF_PROG_RUN
                // call (which sizes its calls itself: see run_xdp).
                batch: 64,
                inject: o.inject,
                xdp_anchor: (o.inject == Inject::XdpLive).then(|| lab.anchor_if.clone()),
            }
            .spawn(None, Some(o.client_core), stop.clone())
            .map_err(|e| BenchError::Other(format!("flood generator: {e}")))?,
        ),
    };
    let sampler = Sampler {
        server_core: o.server_core,
        client_core: o.client_core,
        napi: napi_threads(&lab.srv_if),
        at: std::sync::Mutex::new(Vec::new()),
    };
    let cookies_before = xdp_cookies(&lab.srv_if);
    let job = HandshakeJob {
        addr: format!("{SRV4}:{PORT}")
            .parse()
            .map_err(|_| BenchError::Other("server address".into()))?,
        server_name: SERVER_NAME.into(),
        profile: TlsProfile::tls13_ecdsa(),
        path: path.to_string(),
        pacing: Pacing::Closed {
            concurrency: o.concurrency,
        },
        window: o.window,
        cores: vec![Some(o.client_core)],
        busy_poll: false,
    };
    let report = run_handshakes(&job, &sampler);
    let transfer = run_transfer(
        &TransferJob {
            addr: job.addr,
            server_name: SERVER_NAME.into(),
            profile: TlsProfile::tls13_ecdsa(),
            path: big.to_string(),
            connections: 4,
            window: transfer_window,
            cores: vec![Some(o.client_core)],
            per_second: None,
            busy_poll: false,
        },
        &(),
    )
    .map_or(0.0, |r| r.bytes_per_sec() / 1e6);
    // The steady load: a fixed rate of new connections, well below what the
    // server manages without a flood.
    let steady_offered = steady
        .unwrap_or_else(|| {
            report
                .as_ref()
                .map_or(0.0, |r| r.ops_per_sec() * o.steady_share)
        })
        .max(1.0);
    let steady_report = run_handshakes(
        &HandshakeJob {
            pacing: Pacing::Open {
                per_second: steady_offered,
                max_in_flight: 1024,
            },
            ..job.clone()
        },
        &(),
    );
    let (steady_per_sec, steady_errors, steady_p99_ms) = match &steady_report {
        Ok(r) => (r.ops_per_sec(), r.error_count(), r.latency.p99_us / 1e3),
        Err(_) => (0.0, 1, f64::NAN),
    };
    // The flood alone, for the server's CPU per SYN received.
    let quiet_start = CoreTicks::now(o.server_core).unwrap_or_default();
    let cpu_start = server_cpu_secs(&sampler.napi, server_pid, o.server_core);
    let rx_start = rx_packets(server_pid, &lab.srv_if);
    let t0 = Instant::now();
    std::thread::sleep(flood_only);
    let secs = t0.elapsed().as_secs_f64();
    let flood_only_server_cpu =
        (server_cpu_secs(&sampler.napi, server_pid, o.server_core) - cpu_start).max(0.0) / secs;
    let flood_only_received =
        rx_packets(server_pid, &lab.srv_if).saturating_sub(rx_start) as f64 / secs;
    let flood_only_busy = CoreTicks::now(o.server_core)
        .unwrap_or_default()
        .busy_since(&quiet_start);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let flood_report = match flood {
        Some(h) => Some(
            h.join()
                .map_err(|_| BenchError::Other("flood generator panicked".into()))?
                .map_err(|e| BenchError::Other(format!("flood generator: {e}")))?,
        ),
        None => None,
    };
    // A cell where no handshake succeeded is a result (the flood won),
    // not a failed bench.
    let report = match report {
        Ok(r) => r,
        Err(e) => tlsgate_loadgen::Report {
            first_error: Some(e.to_string()),
            errors: [("none completed".to_string(), 1)].into_iter().collect(),
            ..Default::default()
        },
    };
    let at = sampler.at.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let zero = (CoreTicks::default(), CoreTicks::default(), 0.0, [0, 0]);
    let (a, b) = (at.first().unwrap_or(&zero), at.last().unwrap_or(&zero));
    let server_core_busy = b.0.busy_since(&a.0);
    let flood_rate = flood_report.map_or(0.0, |r| r.rate());
    if let Some(r) = flood_report.filter(|r| r.refused_calls > 0) {
        eprintln!(
            "synflood {mode} {rate:?}: the kernel refused {} BPF_PROG_RUN calls (ENOSPC)",
            r.refused_calls
        );
    }
    let cpu_per_syn_us = match (idle_cpu, flood_rate > 0.0 && flood_only_received > 0.0) {
        (Some(idle), true) => {
            Some((flood_only_server_cpu - idle).max(0.0) / flood_only_received * 1e6)
        }
        _ => None,
    };
    Ok(FloodCell {
        mode,
        target_rate: rate,
        flood_rate,
        handshakes_per_sec: report.ops_per_sec(),
        transfer_mb_per_sec: transfer,
        errors: report.error_count(),
        first_error: report.first_error.clone(),
        steady_offered,
        steady_per_sec,
        steady_errors,
        steady_p99_ms,
        flood_only_received,
        server_core_busy,
        napi_cpu_secs: (b.2 - a.2).max(0.0),
        net_rx_per_sec: [0, 1]
            .map(|k| b.3[k].saturating_sub(a.3[k]) as f64 / o.window.measure.as_secs_f64()),
        client_core_busy: b.1.busy_since(&a.1),
        veth_dropped: tx_dropped(&lab.cli, &lab.cli_if).saturating_sub(dropped_before),
        flood_only_busy,
        flood_only_server_cpu,
        xdp_cookies: xdp_cookies(&lab.srv_if).saturating_sub(cookies_before),
        cpu_per_syn_us,
    })
}

/// The cells as a Markdown table.
pub fn markdown(cells: &[FloodCell]) -> String {
    let mut s = String::from(
        "| mode | flood asked (SYN/s) | flood sent (SYN/s) | handshakes/s (saturated) | steady: done/s of offered | steady p99 (ms) | transfer MB/s | errors | server core busy | server NAPI thread (s) | NET_RX softirqs/s server / client core | client core busy | veth drops | XDP cookies | flood alone: received/s | server core, flood alone | server CPU, flood alone | server CPU per SYN received (µs) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for c in cells {
        let _ = writeln!(
            s,
            "| {} | {} | {:.0} | {:.0} | {:.0} of {:.0} ({} err) | {:.1} | {:.0} | {} | {:.1} % | {:.2} | {:.0} / {:.0} | {:.1} % | {} | {} | {:.0} | {:.1} % | {:.1} % | {} |",
            c.mode,
            c.target_rate.map_or("max".into(), |r| r.to_string()),
            c.flood_rate,
            c.handshakes_per_sec,
            c.steady_per_sec,
            c.steady_offered,
            c.steady_errors,
            c.steady_p99_ms,
            c.transfer_mb_per_sec,
            c.errors,
            c.server_core_busy * 100.0,
            c.napi_cpu_secs,
            c.net_rx_per_sec[0],
            c.net_rx_per_sec[1],
            c.client_core_busy * 100.0,
            c.veth_dropped,
            c.xdp_cookies,
            c.flood_only_received,
            c.flood_only_busy * 100.0,
            c.flood_only_server_cpu * 100.0,
            c.cpu_per_syn_us.map_or("–".into(), |v| format!("{v:.2}")),
        );
    }
    s
}

/// Legitimate handshakes/s against the flood rate reached, one line per
/// mode (the talk's graph), as SVG.
pub fn plot(cells: &[FloodCell], path: &Path) -> Result<(), BenchError> {
    use plotters::prelude::*;
    let fail = |e: String| BenchError::Other(format!("plotting {}: {e}", path.display()));
    let max_x = cells
        .iter()
        .map(|c| c.flood_rate / 1000.0)
        .fold(1.0, f64::max);
    let max_y = cells
        .iter()
        .map(|c| c.handshakes_per_sec)
        .fold(1.0, f64::max);
    let root = SVGBackend::new(path, (1000, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Legitimate TLS handshakes under a spoofed SYN flood",
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..max_x * 1.05, 0.0..max_y * 1.15)
        .map_err(|e| fail(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("flood, thousand SYN/s")
        .y_desc("handshakes/s")
        .draw()
        .map_err(|e| fail(e.to_string()))?;
    type Figure = fn(&FloodCell) -> f64;
    let saturated: Figure = |c| c.handshakes_per_sec;
    let steady: Figure = |c| c.steady_per_sec;
    // Saturated in the mode's colour, the steady load in a lighter shade.
    let series = [("saturated", saturated, 1.0), ("steady load", steady, 0.45)]
        .into_iter()
        .flat_map(|(what, figure, shade)| {
            [
                ("kernel", (0xd6, 0x27, 0x28), "kernel alone"),
                ("xdp", (0x1f, 0x77, 0xb4), "XDP SynGate"),
            ]
            .map(|(mode, (r, g, b), name)| {
                let mix = |v: u8| (f64::from(v) + (255.0 - f64::from(v)) * (1.0 - shade)) as u8;
                (
                    mode,
                    RGBColor(mix(r), mix(g), mix(b)),
                    format!("{name}, {what}"),
                    figure,
                )
            })
        });
    for (mode, color, label, figure) in series {
        let mut points: Vec<(f64, f64)> = cells
            .iter()
            .filter(|c| c.mode == mode)
            .map(|c| (c.flood_rate / 1000.0, figure(c)))
            .collect();
        points.sort_by(|a, b| a.0.total_cmp(&b.0));
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(|e| fail(e.to_string()))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 12, y)], color.stroke_width(2))
            });
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 3, color.filled())),
            )
            .map_err(|e| fail(e.to_string()))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(|e| fail(e.to_string()))?;
    root.present().map_err(|e| fail(e.to_string()))
}
