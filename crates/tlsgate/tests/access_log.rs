//! The access log against outputs that misbehave: a pipe nobody reads,
//! a full disk, a file renamed away; and the lines of responses that
//! broke off.
#![allow(clippy::unwrap_used, missing_docs)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// A FIFO at `path` opened for reading (so the server's end opens and
/// writes do not fail) and its write end for the server's stdout. The
/// read end is returned and never read: the writer's output stalls.
fn stalled_fifo(path: &Path) -> (std::fs::File, Stdio) {
    let ok = Command::new("mkfifo").arg(path).status().unwrap().success();
    assert!(ok, "mkfifo failed");
    // Each end's open waits for the other's.
    let reader = {
        let path = path.to_owned();
        std::thread::spawn(move || std::fs::File::open(path).unwrap())
    };
    let writer = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    (reader.join().unwrap(), Stdio::from(writer))
}

/// Serves with the access log on a stdout that nobody reads and loads it
/// until lines are dropped: the pipe is full, the writer thread is stuck
/// in write(2) and its queue is full behind it.
fn server_with_stuck_log(fx: &Fixture) -> (Server, std::fs::File) {
    let (reader, stdout) = stalled_fifo(&fx.path().join("stdout.fifo"));
    let config = fx.write_config(&fx.config(
        "[server]\nshutdown_timeout = \"2s\"\n[limits]\nhandshake_rate_per_source = 0\n",
        "",
    ));
    let s = Server::spawn_with_stdout(&["serve", "--config", config.to_str().unwrap()], stdout);
    // 404s with long paths: cheap to answer, and each line is long so the
    // pipe fills early. The queue holds 65 536 lines or 16 MiB.
    let url = s.url(&format!("/{}", "x".repeat(200)));
    let deadline = Instant::now() + Duration::from_secs(120);
    while s.metric("tlsgate_access_log_dropped_total") == 0.0 {
        assert!(
            Instant::now() < deadline,
            "the access log queue never filled:\n{}",
            s.log()
        );
        let out = Command::new("h2load")
            .args(["-n", "30000", "-c", "4", "-m", "64", "-t", "1", &url])
            .output()
            .expect("h2load must be installed (./dev setup installs nghttp2-client)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    (s, reader)
}

#[test]
fn stuck_log_output_does_not_hold_up_reload() {
    let fx = Fixture::new();
    let (s, _reader) = server_with_stuck_log(&fx);
    s.signal("HUP");
    // The admin listener runs on the thread that reloads: it answers, and
    // the reload is counted, while the writer is still stuck.
    s.expect_metric_line("tlsgate_reloads_total{result=\"ok\"} 1\n");
    s.wait_log("reloaded configuration", Duration::from_secs(5));
}

#[test]
fn stuck_log_output_does_not_hold_up_shutdown() {
    let fx = Fixture::new();
    let (mut s, _reader) = server_with_stuck_log(&fx);
    let t = Instant::now();
    s.signal("TERM");
    // shutdown_timeout (2 s), the final flush's 2 s and some slack.
    let status = s.wait_exit(Duration::from_secs(8));
    assert_eq!(status.code(), Some(0), "{}", s.log());
    assert!(t.elapsed() < Duration::from_secs(8));
    assert!(
        s.log().contains("access log lines not written"),
        "{}",
        s.log()
    );
}

/// The status and body bytes of the only access-log line for `target`,
/// once it is there (the line is written after the connection broke).
fn only_line_for(s: &Server, target: &str) -> (u16, u64) {
    let line = s.wait_access_line(&[&format!(" {target} HTTP/")]);
    // Nothing more comes for the same request.
    std::thread::sleep(Duration::from_millis(500));
    let log = s.access_log();
    let count = log
        .lines()
        .filter(|l| l.contains(&format!(" {target} HTTP/")))
        .count();
    assert_eq!(count, 1, "{log}");
    let mut fields = line.split('"').nth(2).unwrap().split_whitespace();
    let status = fields.next().unwrap().parse().unwrap();
    let bytes = fields.next().unwrap().parse().unwrap();
    (status, bytes)
}

#[test]
fn responses_broken_off_are_logged_with_the_bytes_sent() {
    let fx = Fixture::new();
    let size = 64u64 << 20;
    std::fs::write(fx.root.join("huge.bin"), vec![5u8; size as usize]).unwrap();
    let s = Server::start(&fx, &fx.config("[limits]\nsend_timeout = \"1s\"\n", ""));
    // The client gives up after a second, over each protocol.
    for (target, protocol) in [("/huge.bin?h1", "--http1.1"), ("/huge.bin?h2", "--http2")] {
        let out = s.curl(&[
            protocol,
            "-m",
            "1",
            "--limit-rate",
            "100k",
            "-o",
            "/dev/null",
            &s.url(target),
        ]);
        assert!(!out.status.success(), "the download was meant to be cut");
        let (status, bytes) = only_line_for(&s, target);
        assert_eq!(status, 200, "{target}");
        assert!(bytes > 0 && bytes < size, "{target}: {bytes} bytes logged");
    }
    // A client that stops reading: the send timeout ends it.
    let mut stalled = tls_connect(s.addr);
    std::io::Write::write_all(
        &mut stalled,
        b"GET /huge.bin?stall HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .unwrap();
    let (status, bytes) = only_line_for(&s, "/huge.bin?stall");
    assert_eq!(status, 200);
    assert!(bytes > 0 && bytes < size, "{bytes} bytes logged");
    drop(stalled);
}

/// Reads one `/hello.txt` answer off a keep-alive connection.
fn read_hello(c: &mut TlsStream) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(HELLO.as_bytes()) {
        let n = std::io::Read::read(c, &mut buf).unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn a_refused_reload_still_reopens_a_rotated_log() {
    let fx = Fixture::new();
    let log = fx.path().join("access.log");
    let s = Server::start(
        &fx,
        &fx.config(&format!("[access_log]\ntarget = {log:?}\n"), ""),
    );
    assert!(s.curl(&[&s.url("/hello.txt?before")]).status.success());
    wait_file_line(&log, "?before");
    // Rotation: the file is renamed away, then SIGHUP, with a config that
    // the reload refuses.
    std::fs::rename(&log, fx.path().join("access.log.1")).unwrap();
    std::fs::write(fx.path().join("tlsgate.toml"), "this is [not toml").unwrap();
    s.signal("HUP");
    s.wait_log("reload refused", Duration::from_secs(5));
    assert!(s.curl(&[&s.url("/hello.txt?after")]).status.success());
    wait_file_line(&log, "?after");
}

#[test]
fn a_full_disk_is_counted_and_warned_about_once() {
    let fx = Fixture::new();
    let s = Server::start(
        &fx,
        &fx.config("[access_log]\ntarget = \"/dev/full\"\n", ""),
    );
    let url = s.url("/hello.txt");
    // 30 requests on one connection.
    let urls: Vec<&str> = std::iter::repeat_n(url.as_str(), 30).collect();
    let out = s.curl(&urls);
    assert!(out.status.success());
    s.expect_metric_line("tlsgate_access_log_dropped_total 30\n");
    let log = s.log();
    assert_eq!(log.matches("access log write failed").count(), 1, "{log}");
    assert!(log.contains("lines lost"), "{log}");
}

/// A tmpfs of `size` mounted at `dir` for a test's lifetime: a disk that
/// fills up partway through a write.
struct SmallDisk(std::path::PathBuf);

impl SmallDisk {
    fn mount(dir: &Path, size: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0755"),
                "tmpfs",
            ])
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "this test needs root to mount a tmpfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallDisk(dir.to_path_buf())
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_line_cut_by_a_full_disk_is_taken_back_not_glued_to_the_next() {
    let fx = Fixture::new();
    let disk = fx.path().join("disk");
    let _mounted = SmallDisk::mount(&disk, "64k");
    // Two pages left free: the log fills them partway through a line.
    let filler = disk.join("filler");
    std::fs::write(&filler, vec![0u8; 56 * 1024]).unwrap();
    let log = disk.join("access.log");
    let s = Server::start(
        &fx,
        &fx.config(&format!("[access_log]\ntarget = {log:?}\n"), ""),
    );
    let urls: Vec<String> = (0..120)
        .map(|n| s.url(&format!("/hello.txt?n={n}")))
        .collect();
    let first: Vec<&str> = urls[..100].iter().map(String::as_str).collect();
    assert!(s.curl(&first).status.success());
    let full = s.metrics_when(|t| !t.contains("tlsgate_access_log_dropped_total 0\n"));
    let dropped = |t: &str| -> u64 {
        t.lines()
            .find_map(|l| l.strip_prefix("tlsgate_access_log_dropped_total "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap()
    };
    assert!(dropped(&full) > 0, "the disk never filled:\n{full}");
    // Room again: the lines after must start on lines of their own.
    std::fs::remove_file(&filler).unwrap();
    let rest: Vec<&str> = urls[100..].iter().map(String::as_str).collect();
    assert!(s.curl(&rest).status.success());
    let text = wait_file_line(&log, "?n=119 ");
    let lost = dropped(&s.admin_get("/metrics"));
    let lines: Vec<&str> = text.lines().collect();
    for l in &lines {
        assert!(
            l.starts_with("127.0.0.1 ") && l.matches("\"GET ").count() == 1 && l.ends_with('"'),
            "a broken line: {l:?}\nin\n{text}"
        );
    }
    for n in 100..120 {
        assert!(
            text.contains(&format!("?n={n} ")),
            "?n={n} missing:\n{text}"
        );
    }
    assert_eq!(
        lines.len() as u64 + lost,
        120,
        "lines written and counted as lost must be every request:\n{text}"
    );
}

#[test]
fn a_reload_switches_the_format_of_open_connections_too() {
    let fx = Fixture::new();
    let combined = fx.path().join("combined.log");
    let json = fx.path().join("json.log");
    let s = Server::start(
        &fx,
        &fx.config(&format!("[access_log]\ntarget = {combined:?}\n"), ""),
    );
    let mut old = tls_connect(s.addr);
    std::io::Write::write_all(
        &mut old,
        b"GET /hello.txt?old1 HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .unwrap();
    read_hello(&mut old);
    wait_file_line(&combined, "?old1");
    fx.write_config(&fx.config(
        &format!("[access_log]\ntarget = {json:?}\nformat = \"json\"\n"),
        "",
    ));
    s.signal("HUP");
    s.wait_log("reloaded configuration", Duration::from_secs(5));
    // The connection from before the reload, then a new one.
    std::io::Write::write_all(
        &mut old,
        b"GET /hello.txt?old2 HTTP/1.1\r\nHost: localhost\r\n\r\n",
    )
    .unwrap();
    read_hello(&mut old);
    assert!(s.curl(&[&s.url("/hello.txt?new")]).status.success());
    wait_file_line(&json, "?old2");
    let text = wait_file_line(&json, "?new");
    for line in text.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}\n{text}"));
        assert_eq!(v["status"], 200, "{line}");
    }
}

/// The server's resident memory in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A log output that stops taking lines costs bounded memory, however big
/// the lines a client makes: Referers of bytes >= 0x80 (each written as
/// `\xHH`, four bytes), over HTTP/2 one ~2.9 KB field repeated ten times
/// (HPACK sends the repeats as one index byte each) and over HTTP/1.1 a
/// 15 KB one. Before the queue was bounded in bytes and the fields cut,
/// 3000 such HTTP/2 requests queued ~350 MB of lines and nothing was
/// counted as dropped.
#[test]
fn huge_client_fields_cannot_grow_a_stuck_log_without_bound() {
    let fx = Fixture::new();
    let (_reader, stdout) = stalled_fifo(&fx.path().join("stdout.fifo"));
    let config = fx.write_config(&fx.config(
        "[server]\nshutdown_timeout = \"2s\"\n[limits]\nhandshake_rate_per_source = 0\n",
        "",
    ));
    let s = Server::spawn_with_stdout(&["serve", "--config", config.to_str().unwrap()], stdout);
    let url = s.url("/hello.txt");
    let h2load = |n: &str, headers: &[std::ffi::OsString]| {
        let out = Command::new("h2load")
            .args(["-n", n, "-c", "1", "-m", "10", "-t", "1"])
            .args(headers)
            .arg(&url)
            .output()
            .expect("h2load must be installed (./dev setup installs nghttp2-client)");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text}");
        assert!(text.contains(&format!("{n} succeeded")), "{text}");
    };
    // Warm up (threads, buffers, TLS) before the baseline.
    h2load("500", &[]);
    let before = rss_kib(s.pid());

    // HTTP/2: ten copies of a 2900-byte field of U+00FF (bytes C3 BF).
    let referer = "\u{ff}".repeat(1450);
    let headers: Vec<std::ffi::OsString> = (0..10)
        .flat_map(|_| ["-H".into(), format!("referer: {referer}").into()])
        .collect();
    h2load("3000", &headers);

    // HTTP/1.1: keep-alive requests with a 15 000-byte Referer of 0xFF.
    let mut c = tls_connect(s.addr);
    let mut req = b"GET /hello.txt HTTP/1.1\r\nHost: localhost\r\nReferer: ".to_vec();
    req.extend_from_slice(&[0xff; 15_000]);
    req.extend_from_slice(b"\r\n\r\n");
    for _ in 0..1000 {
        std::io::Write::write_all(&mut c, &req).unwrap();
        read_hello(&mut c);
    }
    drop(c);

    let grown = rss_kib(s.pid()).saturating_sub(before);
    assert!(
        grown < 64 * 1024,
        "RSS grew by {grown} KiB with the log output stuck"
    );
    assert!(
        s.metric("tlsgate_access_log_dropped_total") > 0.0,
        "no line counted as dropped"
    );
    // Still serving.
    let out = s.curl(&["-s", &url]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), HELLO);
}

/// SIGUSR1, which logrotate snippets written for nginx send, reopens the
/// log at its configured path without reading the configuration (a
/// broken one is not even noticed), and the server keeps serving: the
/// signal's default action used to kill it.
#[test]
fn sigusr1_reopens_a_rotated_log_and_keeps_serving() {
    let fx = Fixture::new();
    let log = fx.path().join("access.log");
    let mut s = Server::start(
        &fx,
        &fx.config(&format!("[access_log]\ntarget = {log:?}\n"), ""),
    );
    assert!(s.curl(&[&s.url("/hello.txt?before")]).status.success());
    wait_file_line(&log, "?before");
    let rotated = fx.path().join("access.log.1");
    std::fs::rename(&log, &rotated).unwrap();
    std::fs::write(fx.path().join("tlsgate.toml"), "this is [not toml").unwrap();
    s.signal("USR1");
    s.wait_log("SIGUSR1: reopening the access log", Duration::from_secs(5));
    let out = s.curl(&[
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        &s.url("/hello.txt?after"),
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200");
    wait_file_line(&log, "?after");
    let old = std::fs::read_to_string(&rotated).unwrap();
    assert!(old.contains("?before") && !old.contains("?after"), "{old}");
    assert!(s.running());
    let text = s.log();
    assert!(!text.contains("reload"), "{text}");
}
