//! The `h2` scenario: HTTP/2 over TLS against every target in the same
//! run (tlsgate, nginx with `http2`, HAProxy with `alpn h2`), driven by
//! `h2load` (the field's HTTP/2 load tool; the bench's own generator speaks
//! HTTP/1.1 only) pinned to the generator's core, server CPU from /proc
//! over each run: many small files over few connections with many streams
//! each, and 1 MiB files. tlsgate is also driven over HTTP/1.1 with the
//! same tool (`h2load --h1`, one request in flight per connection), for
//! its own bytes per CPU-second.

use serde::{Deserialize, Serialize};

use crate::crosscheck::{run_tools, tool_command};
use crate::error::BenchError;
use crate::materials::{size_name, Materials};
use crate::report::Results;
use crate::scenario::BenchOptions;
use crate::targets::{Target, TargetKind};

/// One h2load run against one target, the median of the repeats.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct H2Row {
    /// Target.
    pub target: TargetKind,
    /// File size and load, e.g. "1 KiB, 4 conn × 100 streams".
    pub case: String,
    /// "h2" or "http/1.1".
    pub protocol: String,
    /// Requests completed per second.
    pub requests_per_sec: f64,
    /// Server CPU per request, µs.
    pub server_cpu_us_per_req: f64,
    /// Response body bytes per server CPU-second, MB.
    pub mb_per_cpu_sec: f64,
    /// Requests that succeeded, over the repeats.
    pub requests: u64,
    /// Requests that failed or errored (in flight when h2load's time was up).
    pub failed: u64,
}

/// A case: file size, connections, streams per connection.
struct Case {
    size: u64,
    connections: usize,
    streams: usize,
}

/// "requests: N total, N started, N done, N succeeded, F failed, E errored"
/// and "finished in 3.00s" from h2load: (succeeded, failed + errored, secs).
pub fn parse_h2load(out: &str) -> Option<(u64, u64, f64)> {
    let line = out.lines().find(|l| l.starts_with("requests:"))?;
    let num = |word: &str| -> Option<u64> {
        let at = line.find(&format!(" {word}"))?;
        line.get(..at)?.rsplit([' ', ',']).next()?.parse().ok()
    };
    let secs = out.lines().find_map(|l| {
        let rest = l.strip_prefix("finished in ")?;
        let t = rest.split(',').next()?.trim();
        if let Some(ms) = t.strip_suffix("ms") {
            ms.parse::<f64>().ok().map(|v| v / 1000.0)
        } else {
            t.strip_suffix('s')?.parse().ok()
        }
    })?;
    Some((num("succeeded")?, num("failed")? + num("errored")?, secs))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Runs the cases against every target.
pub fn run(
    materials: &Materials,
    opts: &BenchOptions,
    results: &mut Results,
) -> Result<(), BenchError> {
    let cases = [
        Case {
            size: 1 << 10,
            connections: 4,
            streams: 100,
        },
        Case {
            size: 1 << 20,
            connections: 4,
            streams: 8,
        },
    ];
    let secs = opts.measure.as_secs_f64().max(1.0);
    let warmup = opts.warmup.as_secs_f64().max(0.2);
    let client = opts.placement.client_cores.first().copied().flatten();
    for kind in &opts.targets {
        let target = Target::start(*kind, materials, &opts.settings(1 << 20))?;
        results
            .versions
            .insert(kind.to_string(), target.version().to_string());
        let port = target.addr().port();
        for case in &cases {
            let path = materials.file(case.size)?;
            let url = format!("https://127.0.0.1:{port}{path}");
            let mut protocols = vec!["h2"];
            if *kind == TargetKind::Tlsgate {
                protocols.push("http/1.1");
            }
            for protocol in protocols {
                let (streams, label) = if protocol == "h2" {
                    (
                        case.streams,
                        format!("{} conn × {} streams", case.connections, case.streams),
                    )
                } else {
                    (1, format!("{} conn, HTTP/1.1", case.connections))
                };
                let case_name = format!("{}, {label}", size_name(case.size));
                let mut rates = Vec::new();
                let mut cpus = Vec::new();
                let mut failed = 0;
                let mut requests = 0;
                for repeat in 0..opts.repeats {
                    tracing::info!(
                        "bench h2 [{}/{}] {case_name} → {kind}",
                        repeat + 1,
                        opts.repeats
                    );
                    let mut cmd = tool_command(client, "h2load");
                    cmd.args(["-t", "1", "-c", &case.connections.to_string()])
                        .args(["-m", &streams.to_string()])
                        // h2load takes whole units: milliseconds.
                        .args(["-D", &format!("{:.0}ms", secs * 1000.0)])
                        .args(["--warm-up-time", &format!("{:.0}ms", warmup * 1000.0)]);
                    if protocol == "http/1.1" {
                        cmd.arg("--h1");
                    }
                    cmd.arg(&url);
                    let (outs, cpu_ns) = run_tools(&target, vec![cmd], "h2load")?;
                    let out = outs.first().map(String::as_str).unwrap_or_default();
                    let (ok, bad, t) = parse_h2load(out).ok_or_else(|| {
                        BenchError::Other(format!("cannot read h2load's output: {out}"))
                    })?;
                    failed += bad;
                    requests += ok;
                    // h2load's time covers the measurement, the CPU the
                    // warm-up too: CPU per request is over both.
                    let total = ok.max(1);
                    rates.push(ok as f64 / t.max(1e-9));
                    cpus.push(cpu_ns as f64 / 1000.0 / total as f64 * (t / (t + warmup)));
                }
                let cpu = median(cpus);
                results.h2.push(H2Row {
                    target: *kind,
                    case: case_name,
                    protocol: protocol.into(),
                    requests_per_sec: median(rates),
                    server_cpu_us_per_req: cpu,
                    mb_per_cpu_sec: if cpu > 0.0 {
                        case.size as f64 / cpu
                    } else {
                        0.0
                    },
                    requests,
                    failed,
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_h2loads_summary() {
        let out = "starting benchmark...\nfinished in 3.00s, 27191.57 req/s, 27.98MB/s\nrequests: 81574 total, 81674 started, 81574 done, 81570 succeeded, 3 failed, 1 errored, 0 timeout\n";
        assert_eq!(parse_h2load(out), Some((81570, 4, 3.0)));
        let out = "finished in 735.52ms, 27191.57 req/s\nrequests: 20 total, 20 started, 20 done, 20 succeeded, 0 failed, 0 errored, 0 timeout\n";
        assert_eq!(parse_h2load(out), Some((20, 0, 0.73552)));
        assert_eq!(parse_h2load("nothing"), None);
    }
}
