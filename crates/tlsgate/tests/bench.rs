//! `tlsgate bench --quick` and `tlsgate cost --quick` against real nginx,
//! HAProxy and tlsgate: every scenario must produce sane, non-zero figures.
//! Never a timing threshold (CI machines are shared and noisy).

#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_tlsgate")
}

fn json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).expect("results are JSON")
}

/// One test, run in sequence: two benches at once would pin their servers
/// to the same core and measure each other.
#[test]
fn quick_bench_and_cost_model() {
    quick_bench_measures_every_scenario_on_every_target();
    cost_model_calibrates_predicts_and_validates();
    a_bench_killed_outright_takes_its_server_along();
}

/// The descendants of `pid` whose command line contains `word`.
fn descendants_running(pid: u32, word: &str) -> Vec<u32> {
    tlsgate_bench::proc::ProcessTree::of(pid)
        .pids()
        .iter()
        .copied()
        .filter(|&p| p != pid)
        .filter(|p| {
            let cmdline = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
            String::from_utf8_lossy(&cmdline).contains(word)
        })
        .collect()
}

/// SIGKILL runs no destructor: the servers must still not outlive the
/// bench (they would hold its cores while the next run measures).
fn a_bench_killed_outright_takes_its_server_along() {
    let dir = tempfile::tempdir().unwrap();
    // Killed, it cannot remove its materials (keys included): they go
    // under this test's directory, which is removed.
    let mut bench = Command::new(bin())
        .env("TMPDIR", dir.path())
        .args(["cost", "calibrate", "--quick", "--model"])
        .arg(dir.path().join("model.json"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let wait_for = |what: &str, done: &mut dyn FnMut() -> bool| {
        let limit = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !done() {
            assert!(
                std::time::Instant::now() < limit,
                "timed out waiting for {what}"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    };
    let mut servers = Vec::new();
    wait_for("the bench to start tlsgate", &mut || {
        servers = descendants_running(bench.id(), "serve");
        !servers.is_empty()
    });
    bench.kill().unwrap();
    bench.wait().unwrap();
    wait_for("the orphaned server to exit", &mut || {
        servers
            .iter()
            .all(|pid| !Path::new(&format!("/proc/{pid}")).exists())
    });
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().flatten().collect();
    assert!(
        left.iter().any(|e| e
            .file_name()
            .to_string_lossy()
            .starts_with("tlsgate-bench-")),
        "the bench's materials were not under TMPDIR: {left:?}"
    );
}

fn quick_bench_measures_every_scenario_on_every_target() {
    for program in ["/usr/sbin/nginx", "/usr/sbin/haproxy"] {
        assert!(
            Path::new(program).exists(),
            "{program} is missing: run ./dev setup (the bench compares against it)"
        );
    }
    let out = tempfile::tempdir().unwrap();
    let run = Command::new(bin())
        .args(["bench", "all", "--quick", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "bench failed\n{stdout}\n{stderr}");
    let results = json(&out.path().join("results.json"));
    let report = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    let summaries = results["summaries"].as_array().unwrap();
    for scenario in ["handshake", "transfer", "stream"] {
        for target in ["tlsgate", "nginx", "haproxy"] {
            let rows: Vec<_> = summaries
                .iter()
                .filter(|s| s["scenario"] == scenario && s["target"] == target)
                .collect();
            let expected = match scenario {
                "handshake" => 8,
                "transfer" => 7,
                _ => 1,
            };
            assert_eq!(rows.len(), expected, "{scenario} on {target}");
            for s in rows {
                let case = s["case"].as_str().unwrap();
                for key in ["ops_per_sec", "bytes_per_sec", "cpu_us_per_op", "pss_bytes"] {
                    let v = s[key].as_f64().unwrap();
                    assert!(
                        v > 0.0 && v.is_finite(),
                        "{scenario} {case} {target}: {key} = {v}"
                    );
                }
                if case.contains("resumed") {
                    assert!(
                        s["resumed_share"].as_f64().unwrap() > 0.0,
                        "{case} on {target}: nothing resumed"
                    );
                }
            }
        }
    }
    // tlsgate with its keys in-process beside it, every handshake kind,
    // and the report gives key isolation's cost for each.
    let inproc = summaries
        .iter()
        .filter(|s| s["scenario"] == "handshake" && s["target"] == "tlsgate-inproc")
        .count();
    assert_eq!(inproc, 8, "handshakes on tlsgate-inproc");
    assert!(report.contains("## Key isolation's cost"), "{report}");
    assert!(
        report.contains("| TLS1.3 ECDSA full, saturated | "),
        "{report}"
    );
    // Idle points: every target held its connections, PSS measured, and
    // the report has the table.
    for target in ["tlsgate", "nginx", "haproxy"] {
        let rows: Vec<_> = summaries
            .iter()
            .filter(|s| s["scenario"] == "idle" && s["target"] == target)
            .collect();
        assert_eq!(rows.len(), 1, "idle on {target}");
        assert_eq!(
            rows[0]["connections_open"].as_f64(),
            Some(200.0),
            "{}",
            rows[0]
        );
        assert!(rows[0]["pss_bytes"].as_f64().unwrap() > 0.0, "{}", rows[0]);
    }
    assert!(
        report.contains("## Idle: keep-alive connections"),
        "{report}"
    );
    // Memory cells run on servers started afresh: each target's stream
    // and idle cells start from the same PSS. On the server a stream cell
    // left behind, the idle cell started 17–27 % higher (what the
    // allocator kept), and nginx once stayed at 1 GB for every later cell.
    let cells = results["cells"].as_array().unwrap();
    for target in ["tlsgate", "nginx", "haproxy"] {
        let before: Vec<f64> = cells
            .iter()
            .filter(|c| {
                (c["scenario"] == "stream" || c["scenario"] == "idle") && c["target"] == target
            })
            .map(|c| c["pss_before"].as_f64().unwrap())
            .collect();
        assert_eq!(before.len(), 2, "stream and idle cells of {target}");
        let (low, high) = (before[0].min(before[1]), before[0].max(before[1]));
        assert!(
            low > 0.0 && high <= low * 1.1,
            "{target}: PSS before its memory cells {before:?}: not a fresh server each"
        );
    }
    // Latency at half nginx's rate was measured on every target.
    let latency: Vec<_> = summaries
        .iter()
        .filter(|s| s["scenario"] == "latency")
        .collect();
    assert_eq!(latency.len(), 4, "{latency:?}");
    for s in latency {
        assert!(s["p99_us"].as_f64().unwrap() > 0.0, "{s}");
    }
    // The independent tools ran against every target.
    let cross = results["crosschecks"].as_array().unwrap();
    // s_time, wrk at 1 KiB and at 64 KiB; s_time on tlsgate-inproc.
    assert_eq!(cross.len(), 10, "{cross:?}");
    assert!(
        report.contains("| handshake TLS1.3 ECDSA full, `8 × openssl s_time -new -tls1_3` | "),
        "isolation's cost at s_time's load: {report}"
    );
    // The tools' tlsgate ÷ nginx beside the bench's, with a verdict.
    assert!(
        report.contains("Do the tools and the bench agree?"),
        "{report}"
    );
    let pinned = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    if !pinned {
        eprintln!("NOT CHECKED: one core, so the generator is not pinned and its core's busy share is not measured");
    }
    for c in cross {
        assert!(c["operations"].as_u64().unwrap() > 0, "{c}");
        assert!(c["server_cpu_us_per_op"].as_f64().unwrap() > 0.0, "{c}");
        // ... and the bench's generator at the same load, right after.
        assert!(c["bench_cpu_us_per_op"].as_f64().unwrap() > 0.0, "{c}");
        // One round in a quick run; its figures are the check's.
        let rounds = c["rounds"].as_array().unwrap();
        assert_eq!(rounds.len(), 1, "{c}");
        assert_eq!(
            rounds[0]["tool_cpu_us_per_op"], c["server_cpu_us_per_op"],
            "{c}"
        );
        // The bench's generator ran at the tool's rate, not above it (left
        // to itself, it asked 20–35 % more of the server than wrk).
        let round = &rounds[0];
        let tool_rate =
            round["tool_operations"].as_f64().unwrap() / round["tool_secs"].as_f64().unwrap();
        let bench_rate = c["bench_ops_per_sec"].as_f64().unwrap();
        assert!(
            bench_rate > 0.0 && bench_rate <= tool_rate * 1.15,
            "tool {tool_rate:.0}/s, bench {bench_rate:.0}/s: {c}"
        );
        // Both kept the generator's core somewhat busy; it is pinned, and
        // so measured, on machines of two or more cores.
        if pinned {
            for busy in ["tool_generator_busy", "bench_generator_busy"] {
                let b = c[busy].as_f64().unwrap();
                assert!(b > 0.0 && b <= 1.0, "{busy}: {c}");
            }
        }
    }
    // HTTP/2 with h2load: three cases on every target (the last at an
    // offered load), over h2 and HTTP/1.1.
    let h2 = results["h2"].as_array().unwrap();
    assert_eq!(h2.len(), 3 * 3 * 2, "{h2:?}");
    let offered: Vec<_> = h2
        .iter()
        .filter_map(|r| r["offered_per_sec"].as_f64())
        .collect();
    assert_eq!(offered, vec![400.0; 3 * 2], "{h2:?}");
    for r in h2 {
        // How busy the server and the generator's core were: the server's
        // CPU is a share of the run's wall time (one worker: at most about
        // one core), the generator's is measured where it is pinned.
        let server_busy = r["server_busy"].as_f64().unwrap();
        assert!(server_busy > 0.0 && server_busy < 1.5, "{r}");
        let generator_busy = r["generator_busy"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&generator_busy), "{r}");
        if pinned {
            assert!(generator_busy > 0.0, "{r}");
        }
        // Only requests in flight when h2load's time was up may fail.
        assert!(
            r["failed"].as_u64().unwrap() * 100 <= r["requests"].as_u64().unwrap(),
            "{r}"
        );
        for key in [
            "requests_per_sec",
            "server_cpu_us_per_req",
            "mb_per_cpu_sec",
        ] {
            let v = r[key].as_f64().unwrap();
            assert!(v > 0.0 && v.is_finite(), "{key}: {r}");
        }
        // Every h2 row carries its ratio to the same target's HTTP/1.1,
        // from the same repeats; no HTTP/1.1 row does.
        let ratio = &r["per_repeat_ratio_to_http1"];
        if r["protocol"] == "h2" {
            let x = ratio.as_f64().unwrap();
            assert!(x > 0.0 && x.is_finite(), "{r}");
        } else {
            assert!(ratio.is_null(), "{r}");
        }
    }
    // The proxy scenario: every target proxying to the same upstream, three
    // cases each and two more through a PROXY protocol port where the
    // target can send the header, every figure there, finite and non-zero
    // (a PROXY protocol case whose header nginx refused would fail its
    // requests); the upstream's CPU is measured apart from the proxy's.
    // The TLS relay, the floor of the ratios, is beside them in the
    // keep-alive cases only.
    for target in ["tlsgate", "nginx", "haproxy", "haproxy-relay"] {
        let rows: Vec<_> = summaries
            .iter()
            .filter(|s| s["scenario"] == "proxy" && s["target"] == target)
            .collect();
        let cases: Vec<_> = rows.iter().map(|s| s["case"].as_str().unwrap()).collect();
        let mut expected = vec!["1 KiB keep-alive", "64 KiB keep-alive"];
        if target != "haproxy-relay" {
            expected.push("1 KiB, new TLS 1.3 connection per request");
        }
        // nginx's HTTP proxy cannot send a PROXY protocol header.
        if target == "tlsgate" || target == "haproxy" {
            expected.extend([
                "1 KiB keep-alive, PROXY protocol v2 upstream",
                "1 KiB, new TLS 1.3 connection per request, PROXY protocol v2 upstream",
            ]);
        }
        assert_eq!(cases, expected, "proxy on {target}");
        for s in rows {
            for key in [
                "ops_per_sec",
                "bytes_per_sec",
                "cpu_us_per_op",
                "p50_us",
                "p99_us",
                "server_utilization",
                "beside_cpu_us_per_op",
            ] {
                let v = s[key].as_f64().unwrap();
                assert!(v > 0.0 && v.is_finite(), "proxy on {target}: {key}: {s}");
            }
            if pinned {
                let b = s["client_core_busy"].as_f64().unwrap();
                assert!(b > 0.0 && b <= 1.0, "proxy on {target}: {s}");
            }
            assert!(s["error_rate"].as_f64().unwrap() <= 0.01, "{s}");
        }
    }
    assert!(
        report.contains("| 1 KiB keep-alive | haproxy-relay |"),
        "{report}"
    );
    assert!(
        results["versions"]["upstream"]
            .as_str()
            .unwrap()
            .contains("nginx"),
        "{}",
        results["versions"]
    );
    assert!(report.contains("## Proxy: TLS 1.3 in"), "{report}");
    // The floor was measured and every handshake kind has one.
    let bounds = &results["bounds"]["ops_ns"];
    for op in [
        "x25519",
        "ecdsa_p256_sign",
        "rsa2048_pss_sign",
        "tcp_accept_close",
    ] {
        assert!(bounds[op].as_f64().unwrap() > 0.0, "bound {op}");
    }
    assert!(report.contains("| TLS1.3 ECDSA full |"), "{report}");
    assert!(report.contains("## HTTP/2 (h2load)"), "{report}");
    for plot in [
        "handshake-cpu.svg",
        "transfer-throughput.svg",
        "transfer-cpu-per-byte.svg",
        "stream-cpu.svg",
        "stream-memory.svg",
    ] {
        let svg = std::fs::read_to_string(out.path().join(plot)).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("tlsgate"), "{plot}");
    }
    // `bench report` writes the report again from results.json alone.
    std::fs::remove_file(out.path().join("report.md")).unwrap();
    std::fs::remove_file(out.path().join("handshake-cpu.svg")).unwrap();
    let again = Command::new(bin())
        .args(["bench", "report", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(again.status.success(), "{again:?}");
    let rewritten = std::fs::read_to_string(out.path().join("report.md")).unwrap();
    assert_eq!(rewritten, report);
    assert!(out.path().join("handshake-cpu.svg").exists());
    // Without results, it says which file it could not read, and exits 2.
    let empty = tempfile::tempdir().unwrap();
    let refused = Command::new(bin())
        .args(["bench", "report", "--out"])
        .arg(empty.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert!(err.contains("results.json"), "{err}");
}

fn cost_model_calibrates_predicts_and_validates() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model.json");
    let run = Command::new(bin())
        .args(["cost", "calibrate", "--quick", "--model"])
        .arg(&model)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "{}{}",
        String::from_utf8_lossy(&run.stdout),
        String::from_utf8_lossy(&run.stderr)
    );
    // Both start from a server whose session cache has filled, as one
    // that has served a while.
    assert!(
        String::from_utf8_lossy(&run.stderr).contains("cost: settled:"),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let m = json(&model);
    for kind in [
        "TLS1.3 ECDSA full",
        "TLS1.3 ECDSA resumed",
        "TLS1.2 RSA full",
    ] {
        assert!(m["handshake_us"][kind].as_f64().unwrap() > 0.0, "{kind}");
    }
    for version in ["TLS1.3", "TLS1.2"] {
        for cipher in ["AES-128-GCM", "AES-256-GCM", "CHACHA20-POLY1305"] {
            // A point per calibrated size, each bigger transaction costing more.
            let key = format!("{version} {cipher}");
            let curve = m["byte_curve"][&key].as_array().unwrap();
            assert_eq!(curve.len(), 3, "{key}: {curve:?}");
            let ns: Vec<f64> = curve.iter().map(|p| p["ns"].as_f64().unwrap()).collect();
            assert!(ns[0] > 0.0 && ns[2] > ns[0], "{key}: {curve:?}");
        }
    }

    let predict = Command::new(bin())
        .args([
            "cost",
            "predict",
            "--rate",
            "1000",
            "--bytes",
            "64k",
            "--resumed",
            "0.5",
            "--model",
        ])
        .arg(&model)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&predict.stdout);
    assert!(predict.status.success(), "{text}");
    assert!(
        text.contains("cpu(txn) = (1 − r)·h_full + r·h_resumed + B(T)"),
        "{text}"
    );
    assert!(text.contains("cores needed"), "{text}");

    // Client certificates are calibrated kinds of their own.
    let mtls = Command::new(bin())
        .args([
            "cost", "predict", "--rate", "100", "--bytes", "1k", "--mtls", "--model",
        ])
        .arg(&model)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&mtls.stdout);
    assert!(mtls.status.success(), "{text}");
    assert!(
        text.contains("workload:") && text.contains("mTLS"),
        "{text}"
    );

    // A workload out of range is refused with exit 2, naming the problem.
    let bad = Command::new(bin())
        .args([
            "cost",
            "predict",
            "--rate",
            "1",
            "--bytes",
            "1",
            "--resumed",
            "1.5",
            "--model",
        ])
        .arg(&model)
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("resumed"));

    // Quick validation: the table is complete; the error is reported, not
    // asserted (a quick calibration is too short to be accurate).
    let validate = Command::new(bin())
        .args([
            "cost",
            "validate",
            "--quick",
            "--max-error",
            "1000000",
            "--model",
        ])
        .arg(&model)
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&validate.stdout);
    assert!(
        validate.status.success(),
        "{table}{}",
        String::from_utf8_lossy(&validate.stderr)
    );
    assert_eq!(
        table
            .lines()
            .filter(|l| l.starts_with("| 1k per txn")
                || l.starts_with("| 8m per txn")
                || l.starts_with("| 3m per txn")
                || l.starts_with("| 32k per txn"))
            .count(),
        7,
        "{table}"
    );
    assert!(table.contains("worst error:"), "{table}");
    assert!(
        String::from_utf8_lossy(&validate.stderr).contains("cost: settled:"),
        "{}",
        String::from_utf8_lossy(&validate.stderr)
    );
}
