//! The `h2` scenario: HTTP/2 over TLS against every target in the same
//! run (tlsgate, nginx with `http2`, HAProxy with `alpn h2`), driven by
//! `h2load` (the field's HTTP/2 load tool; the bench's own generator speaks
//! HTTP/1.1 only) pinned to the generator's core, server CPU from /proc
//! over each run: many small files over few connections with many streams
//! each, and 1 MiB files. Every target is also driven over HTTP/1.1 with
//! the same tool (`h2load --h1`, one request in flight per connection):
//! each h2 row carries its bytes per CPU-second ÷ the same target's over
//! HTTP/1.1, what HTTP/2 costs each server over the simpler protocol.

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
    /// h2 rows: bytes per CPU-second over h2 ÷ the same target's over
    /// HTTP/1.1, the median of each repeat's pair (measured seconds apart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_repeat_ratio_to_http1: Option<f64>,
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

/// One (target, case, protocol) cell and what its repeats measured.
struct Cell {
    target: usize,
    case: usize,
    protocol: &'static str,
    streams: usize,
    name: String,
    rates: Vec<f64>,
    /// Server CPU µs per request, by repeat.
    cpus: Vec<f64>,
    failed: u64,
    requests: u64,
}

/// Runs the cases against every target.
///
/// Every target runs from the start and each repeat runs every cell once,
/// in an order rotated by the repeat, as the other scenarios interleave:
/// the figures the goals compare (tlsgate's h2 against nginx's, against
/// its own HTTP/1.1) come from windows seconds apart, not minutes apart,
/// on a machine whose speed drifts.
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
    // The files first: HAProxy's configuration holds them (it answers
    // from memory), so they must exist before it starts.
    let paths = cases
        .iter()
        .map(|c| materials.file(c.size))
        .collect::<Result<Vec<_>, _>>()?;
    let mut targets = Vec::new();
    for kind in &opts.targets {
        let target = Target::start(*kind, materials, &opts.settings(1 << 20))?;
        results
            .versions
            .insert(kind.to_string(), target.version().to_string());
        targets.push(target);
    }
    let mut cells = Vec::new();
    for ti in 0..targets.len() {
        for (ci, case) in cases.iter().enumerate() {
            // Every target over HTTP/1.1 too: tlsgate's goal is its own
            // h2 ÷ HTTP/1.1, and the peers' ratios say what h2 costs them.
            let protocols = ["h2", "http/1.1"];
            for protocol in protocols {
                let (streams, label) = if protocol == "h2" {
                    (
                        case.streams,
                        format!("{} conn × {} streams", case.connections, case.streams),
                    )
                } else {
                    (1, format!("{} conn, HTTP/1.1", case.connections))
                };
                cells.push(Cell {
                    target: ti,
                    case: ci,
                    protocol,
                    streams,
                    name: format!("{}, {label}", size_name(case.size)),
                    rates: Vec::new(),
                    cpus: Vec::new(),
                    failed: 0,
                    requests: 0,
                });
            }
        }
    }
    let n = cells.len();
    for repeat in 0..opts.repeats {
        for k in 0..n {
            let Some(cell) = cells.get_mut((k + repeat) % n) else {
                continue;
            };
            let (Some(target), Some(case), Some(path)) = (
                targets.get(cell.target),
                cases.get(cell.case),
                paths.get(cell.case),
            ) else {
                continue;
            };
            tracing::info!(
                "bench h2 [{}/{}] {} → {}",
                repeat + 1,
                opts.repeats,
                cell.name,
                target.kind()
            );
            let url = format!("https://127.0.0.1:{}{path}", target.addr().port());
            let mut cmd = tool_command(client, "h2load");
            cmd.args(["-t", "1", "-c", &case.connections.to_string()])
                .args(["-m", &cell.streams.to_string()])
                // h2load takes whole units: milliseconds.
                .args(["-D", &format!("{:.0}ms", secs * 1000.0)])
                .args(["--warm-up-time", &format!("{:.0}ms", warmup * 1000.0)]);
            if cell.protocol == "http/1.1" {
                cmd.arg("--h1");
            }
            cmd.arg(&url);
            let (outs, cpu_ns) = run_tools(target, vec![cmd], "h2load")?;
            let out = outs.first().map(String::as_str).unwrap_or_default();
            let (ok, bad, t) = parse_h2load(out)
                .ok_or_else(|| BenchError::Other(format!("cannot read h2load's output: {out}")))?;
            cell.failed += bad;
            cell.requests += ok;
            // h2load's time covers the measurement, the CPU the warm-up
            // too: CPU per request is over both.
            let total = ok.max(1);
            cell.rates.push(ok as f64 / t.max(1e-9));
            cell.cpus
                .push(cpu_ns as f64 / 1000.0 / total as f64 * (t / (t + warmup)));
        }
    }
    for cell in &cells {
        let (Some(target), Some(case)) = (targets.get(cell.target), cases.get(cell.case)) else {
            continue;
        };
        // CPU per request over HTTP/1.1 ÷ over h2, repeat by repeat, is
        // h2's bytes per CPU-second ÷ HTTP/1.1's.
        let per_repeat_ratio_to_http1 = (cell.protocol == "h2")
            .then(|| {
                cells.iter().find(|c| {
                    c.target == cell.target && c.case == cell.case && c.protocol == "http/1.1"
                })
            })
            .flatten()
            .map(|h1| {
                median(
                    h1.cpus
                        .iter()
                        .zip(&cell.cpus)
                        .map(|(one, two)| one / two.max(1e-9))
                        .collect(),
                )
            });
        let cpu = median(cell.cpus.clone());
        results.h2.push(H2Row {
            target: target.kind(),
            case: cell.name.clone(),
            protocol: cell.protocol.into(),
            requests_per_sec: median(cell.rates.clone()),
            server_cpu_us_per_req: cpu,
            mb_per_cpu_sec: if cpu > 0.0 {
                case.size as f64 / cpu
            } else {
                0.0
            },
            requests: cell.requests,
            failed: cell.failed,
            per_repeat_ratio_to_http1,
        });
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
