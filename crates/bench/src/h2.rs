//! The `h2` scenario: HTTP/2 over TLS against every target in the same
//! run (tlsgate, nginx with `http2`, HAProxy with `alpn h2`), driven by
//! `h2load` (the field's HTTP/2 load tool; the bench's own generator speaks
//! HTTP/1.1 only) pinned to the generator's core, server CPU from /proc
//! over each run: many small files over few connections with many streams
//! each, and 1 MiB files. Every target is also driven over HTTP/1.1 with
//! the same tool (`h2load --h1`, one request in flight per connection):
//! each h2 row carries its bytes per CPU-second ÷ the same target's over
//! HTTP/1.1, what HTTP/2 costs each server over the simpler protocol.
//!
//! On a two-core machine one h2load thread cannot keep a server busy with
//! 1 MiB files: decrypting costs it about what encrypting costs the
//! server. A run where the generator's core is saturated and the server's
//! is not compares how each protocol paces the client, not what serving
//! costs, so every row says how busy both were (⚠ when the generator was
//! the limit), and 1 MiB files are also sent at one offered load below
//! every target's capacity (`--rps`), where both protocols carry the same
//! bytes per second and CPU per byte compares like with like.

use serde::{Deserialize, Serialize};

use std::time::Instant;

use crate::crosscheck::{on_core, run_tools, tool_command};
use crate::error::BenchError;
use crate::materials::{size_name, Materials};
use crate::report::{generator_limited, Results};
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
    /// The server's CPU over the run ÷ the run's wall time (median).
    #[serde(default)]
    pub server_busy: f64,
    /// The generator core's busy share over the run (median); 0 without
    /// a generator core.
    #[serde(default)]
    pub generator_busy: f64,
    /// Fixed-load rows: the requests per second offered (h2load `--rps`
    /// per connection × connections).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offered_per_sec: Option<f64>,
}

impl H2Row {
    /// The generator, not the server, was the limit.
    pub fn generator_bound(&self) -> bool {
        generator_limited(self.generator_busy, self.server_busy)
    }

    /// A fixed-load row whose server did not keep up with the offered
    /// rate: it ran saturated, so it does not compare at equal load.
    pub fn missed_offered_load(&self) -> bool {
        self.offered_per_sec
            .is_some_and(|offered| self.requests_per_sec < offered * OFFERED_LOAD_REACHED)
    }
}

/// Share of a fixed load's offered rate a row must reach to count as
/// measured at that load.
const OFFERED_LOAD_REACHED: f64 = 0.95;

/// The 1 MiB fixed load per connection, requests (MiB) per second: 400
/// MiB/s over the case's four connections. On this machine that is about
/// a third of what one tlsgate worker serves, three fifths of one nginx
/// worker, and well within what one h2load thread takes in.
const FIXED_LOAD_PER_CONNECTION: u32 = 100;

/// A case: file size, connections, streams per connection, and the
/// requests per second each connection is offered (`None`: as many as the
/// server answers).
struct Case {
    size: u64,
    connections: usize,
    streams: usize,
    rps_per_connection: Option<u32>,
}

impl Case {
    fn offered_per_sec(&self) -> Option<f64> {
        self.rps_per_connection
            .map(|r| f64::from(r) * self.connections as f64)
    }
}

/// What one h2load run reports.
#[derive(Debug, PartialEq)]
pub struct H2Load {
    /// Requests that succeeded within the measurement.
    pub succeeded: u64,
    /// Requests that failed or errored.
    pub failed: u64,
    /// "finished in": the warm-up and the measurement, seconds.
    pub finished_secs: f64,
    /// Requests per second over the measurement alone.
    pub per_sec: f64,
}

impl H2Load {
    /// The measurement's own length, seconds: h2load counts requests and
    /// their rate over it, but its "finished in" includes the warm-up.
    pub fn measured_secs(&self) -> f64 {
        if self.per_sec > 0.0 {
            self.succeeded as f64 / self.per_sec
        } else {
            self.finished_secs
        }
    }
}

/// "finished in 3.00s, 971.50 req/s, …" and "requests: N total, N
/// started, N done, N succeeded, F failed, E errored" from h2load.
pub fn parse_h2load(out: &str) -> Option<H2Load> {
    let line = out.lines().find(|l| l.starts_with("requests:"))?;
    let num = |word: &str| -> Option<u64> {
        let at = line.find(&format!(" {word}"))?;
        line.get(..at)?.rsplit([' ', ',']).next()?.parse().ok()
    };
    let finished = out.lines().find_map(|l| l.strip_prefix("finished in "))?;
    let mut fields = finished.split(',').map(str::trim);
    let t = fields.next()?;
    let finished_secs = if let Some(ms) = t.strip_suffix("ms") {
        ms.parse::<f64>().ok()? / 1000.0
    } else {
        t.strip_suffix('s')?.parse().ok()?
    };
    let per_sec = fields.next()?.strip_suffix(" req/s")?.parse().ok()?;
    Some(H2Load {
        succeeded: num("succeeded")?,
        failed: num("failed")? + num("errored")?,
        finished_secs,
        per_sec,
    })
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
    /// Server CPU ÷ wall time, by repeat.
    server_busy: Vec<f64>,
    /// The generator core's busy share, by repeat.
    generator_busy: Vec<f64>,
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
            rps_per_connection: None,
        },
        Case {
            size: 1 << 20,
            connections: 4,
            streams: 8,
            rps_per_connection: None,
        },
        Case {
            size: 1 << 20,
            connections: 4,
            streams: 8,
            rps_per_connection: Some(FIXED_LOAD_PER_CONNECTION),
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
                let (streams, mut label) = if protocol == "h2" {
                    (
                        case.streams,
                        format!("{} conn × {} streams", case.connections, case.streams),
                    )
                } else {
                    (1, format!("{} conn, HTTP/1.1", case.connections))
                };
                if let Some(offered) = case.offered_per_sec() {
                    label.push_str(&format!(", {offered:.0} req/s offered"));
                }
                cells.push(Cell {
                    target: ti,
                    case: ci,
                    protocol,
                    streams,
                    name: format!("{}, {label}", size_name(case.size)),
                    rates: Vec::new(),
                    cpus: Vec::new(),
                    server_busy: Vec::new(),
                    generator_busy: Vec::new(),
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
            if let Some(rps) = case.rps_per_connection {
                cmd.arg(format!("--rps={rps}"));
            }
            cmd.arg(&url);
            let began = Instant::now();
            let (ran, generator_busy) = on_core(client, || run_tools(target, vec![cmd], "h2load"));
            let (outs, cpu_ns) = ran?;
            let wall = began.elapsed().as_secs_f64();
            cell.server_busy.push(cpu_ns as f64 / 1e9 / wall.max(1e-9));
            cell.generator_busy.push(generator_busy);
            let out = outs.first().map(String::as_str).unwrap_or_default();
            let run = parse_h2load(out)
                .ok_or_else(|| BenchError::Other(format!("cannot read h2load's output: {out}")))?;
            cell.failed += run.failed;
            cell.requests += run.succeeded;
            // h2load counts requests over its measurement only, the CPU
            // covers the whole run (warm-up, connections, their end): the
            // measurement's share of the run's CPU per request counted.
            let share = (run.measured_secs() / wall.max(1e-9)).min(1.0);
            cell.rates.push(run.per_sec);
            cell.cpus
                .push(cpu_ns as f64 * share / 1000.0 / run.succeeded.max(1) as f64);
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
        let server_busy = median(cell.server_busy.clone());
        let generator_busy = median(cell.generator_busy.clone());
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
            server_busy,
            generator_busy,
            offered_per_sec: case.offered_per_sec(),
        });
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_h2loads_summary() {
        // h2load 1.52 with a 1 s warm-up and 2 s of measurement.
        let out = "starting benchmark...\nfinished in 3.01s, 971.50 req/s, 974.47MB/s\nrequests: 1943 total, 1943 started, 1943 done, 1940 succeeded, 2 failed, 1 errored, 0 timeout\n";
        let run = parse_h2load(out).unwrap();
        assert_eq!(
            run,
            H2Load {
                succeeded: 1940,
                failed: 3,
                finished_secs: 3.01,
                per_sec: 971.5
            }
        );
        assert!((run.measured_secs() - 1940.0 / 971.5).abs() < 1e-9);
        let out = "finished in 735.52ms, 27.19 req/s\nrequests: 20 total, 20 started, 20 done, 20 succeeded, 0 failed, 0 errored, 0 timeout\n";
        let run = parse_h2load(out).unwrap();
        assert!((run.finished_secs - 0.73552).abs() < 1e-9);
        assert_eq!(run.succeeded, 20);
        assert_eq!(parse_h2load("nothing"), None);
        assert_eq!(
            parse_h2load(
                "finished in 3.00s\nrequests: 1 total, 1 succeeded, 0 failed, 0 errored\n"
            ),
            None
        );
    }

    #[test]
    fn a_row_says_when_it_missed_its_offered_load_or_the_generator_was_the_limit() {
        let row = |per_sec, offered| H2Row {
            target: TargetKind::Tlsgate,
            case: "1m".into(),
            protocol: "h2".into(),
            requests_per_sec: per_sec,
            server_cpu_us_per_req: 600.0,
            mb_per_cpu_sec: 1700.0,
            requests: 1800,
            failed: 0,
            per_repeat_ratio_to_http1: None,
            server_busy: 0.5,
            generator_busy: 0.5,
            offered_per_sec: offered,
        };
        assert!(!row(600.0, Some(600.0)).missed_offered_load());
        assert!(!row(575.0, Some(600.0)).missed_offered_load());
        assert!(row(450.0, Some(600.0)).missed_offered_load());
        // A saturated row has no offered load to fall short of.
        assert!(!row(450.0, None).missed_offered_load());
        // The generator is the limit only while the server is not busy.
        let mut limited = row(1000.0, None);
        assert!(!limited.generator_bound());
        limited.generator_busy = 0.97;
        limited.server_busy = 0.8;
        assert!(limited.generator_bound());
        limited.server_busy = 0.95;
        assert!(!limited.generator_bound());
    }
}
