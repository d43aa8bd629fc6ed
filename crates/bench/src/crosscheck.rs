//! An independent measurement: the field's own tools (`openssl s_time` for
//! handshakes, `wrk` for keep-alive transfers) against the same targets,
//! with server CPU from /proc, next to the bench's own generator driving
//! the same target at the same load right after. If the two disagree
//! beyond noise, the bench's generator is suspect.
//!
//! Same load matters: CPU per operation depends on it. `s_time` runs one
//! connection at a time per process and keeps a server partly idle, where
//! every handshake pays wake-ups a saturated server amortizes; so the
//! bench's figure it is compared with is measured at `s_time`'s rate (open
//! loop), not the saturated one (shown beside it). So does whether the
//! server's replies find the client running: eight `s_time` processes keep
//! the generator's core busy, so the bench's generator polls there.

use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use tlsgate_loadgen::{HandshakeJob, Pacing, TlsProfile, TransferJob, Window};

use crate::error::BenchError;
use crate::materials::{Materials, SERVER_NAME};
use crate::proc::CoreTicks;
use crate::report::Results;
use crate::runner::{Job, Runner};
use crate::scenario::BenchOptions;
use crate::targets::{Target, TargetKind};

/// One tool's run against one target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CrossCheck {
    /// Target.
    pub target: TargetKind,
    /// The bench case it corresponds to.
    pub case: String,
    /// The tool and its arguments.
    pub tool: String,
    /// Operations the tool completed.
    pub operations: u64,
    /// Its run time, seconds.
    pub secs: f64,
    /// Server CPU per operation during the tool's run, µs.
    pub server_cpu_us_per_op: f64,
    /// Server CPU per operation with the bench's generator at the tool's
    /// load (same rate or same connections), µs.
    pub bench_cpu_us_per_op: f64,
    /// What the bench's generator ran for that figure.
    #[serde(default)]
    pub bench_load: String,
    /// The bench's saturated figure for the case, from this run's
    /// handshake or transfer scenario, µs (0 if not measured).
    #[serde(default)]
    pub bench_saturated_cpu_us_per_op: f64,
    /// Busy share of the generator's core while the tool ran (0 when the
    /// generator is not pinned): whether the server's replies found its
    /// client running or had to wake it.
    #[serde(default)]
    pub tool_generator_busy: f64,
    /// The same while the bench's generator ran at the tool's load.
    #[serde(default)]
    pub bench_generator_busy: f64,
}

/// Busy share of `core` while `f` runs (0 without a core).
fn on_core<T>(core: Option<usize>, f: impl FnOnce() -> T) -> (T, f64) {
    let before = core.and_then(CoreTicks::now);
    let out = f();
    let busy = match (before, core.and_then(CoreTicks::now)) {
        (Some(a), Some(b)) => b.busy_since(&a),
        _ => 0.0,
    };
    (out, busy)
}

/// `program`, pinned to `core` with taskset when there is one.
pub(crate) fn tool_command(core: Option<usize>, program: &str) -> Command {
    match core {
        Some(c) => {
            let mut cmd = Command::new("taskset");
            cmd.arg("-c").arg(c.to_string()).arg(program);
            cmd
        }
        None => Command::new(program),
    }
}

/// Runs the commands in parallel while sampling the target's CPU; returns
/// their outputs and the server's CPU ns.
pub(crate) fn run_tools(
    target: &Target,
    cmds: Vec<Command>,
    what: &str,
) -> Result<(Vec<String>, u64), BenchError> {
    let before = target.tree().cpu_ns();
    let mut children = Vec::new();
    for mut cmd in cmds {
        tlsgate_sys::ipc::terminate_with_spawning_thread(&mut cmd);
        let child = cmd
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| BenchError::Missing {
                program: what.into(),
                hint: format!("{e}; run ./dev setup"),
            })?;
        children.push(child);
    }
    let mut outs = Vec::new();
    for child in children {
        let out = child
            .wait_with_output()
            .map_err(|e| BenchError::Other(format!("{what}: {e}")))?;
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        if !out.status.success() {
            return Err(BenchError::Other(format!(
                "{what} against {} failed ({}): {}{}",
                target.kind(),
                out.status,
                stdout,
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        outs.push(stdout);
    }
    let cpu = target.tree().cpu_ns().saturating_sub(before);
    Ok((outs, cpu))
}

/// Sums the operations of parallel runs; the time is the longest run's.
fn sum_runs(
    outs: &[String],
    parse: fn(&str) -> Option<(u64, f64)>,
    what: &str,
) -> Result<(u64, f64), BenchError> {
    let mut total = (0u64, 0.0f64);
    for out in outs {
        let (n, t) = parse(out)
            .ok_or_else(|| BenchError::Other(format!("cannot read {what}'s output: {out}")))?;
        total = (total.0 + n, total.1.max(t));
    }
    Ok(total)
}

/// Parallel `openssl s_time` processes: one alone runs one connection at a
/// time and never loads the server.
const S_TIME_PROCESSES: usize = 8;

/// "N connections in T real seconds" from `openssl s_time`.
pub fn parse_s_time(out: &str) -> Option<(u64, f64)> {
    out.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        let n = w.next()?.parse().ok()?;
        if w.next()? != "connections" || w.next()? != "in" {
            return None;
        }
        let secs = w.next()?.parse().ok()?;
        (w.next()? == "real").then_some((n, secs))
    })
}

/// "N requests in 3.00s, …" from `wrk`; `None` also when it reports
/// answers that were not 2xx or 3xx (a refused or broken run is no
/// figure).
pub fn parse_wrk(out: &str) -> Option<(u64, f64)> {
    if out.contains("Non-2xx or 3xx responses") {
        return None;
    }
    out.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        let n = w.next()?.parse().ok()?;
        if w.next()? != "requests" || w.next()? != "in" {
            return None;
        }
        let secs = w
            .next()?
            .trim_end_matches(',')
            .trim_end_matches('s')
            .parse()
            .ok()?;
        Some((n, secs))
    })
}

/// Connections of `wrk` and of the bench's transfer at the same load.
const WRK_CONNECTIONS: usize = 100;

/// Runs both tools against every target, each followed by the bench's
/// generator at the same load.
pub fn run(
    materials: &Materials,
    opts: &BenchOptions,
    results: &mut Results,
) -> Result<(), BenchError> {
    let small = materials.file(1 << 10)?;
    let medium = materials.file(64 << 10)?;
    let secs = if opts.quick { 1 } else { 3 };
    let window = Window {
        warmup: opts.warmup,
        measure: Duration::from_secs(secs),
    };
    let client = opts.placement.client_cores.first().copied().flatten();
    let mut rows = Vec::new();
    // tlsgate with its keys in-process too: key isolation's cost at
    // s_time's load (handshakes only, unless it is a target of its own:
    // keep-alive transfers sign nothing).
    for kind in &opts.handshake_targets() {
        let mut target = Target::start(*kind, materials, &opts.settings(64 << 10))?;
        let addr = target.addr();
        let port = addr.port();
        // Handshakes: new connections, TLS 1.3, AES-128-GCM.
        let cmds = (0..S_TIME_PROCESSES)
            .map(|_| {
                let mut cmd = tool_command(client, "openssl");
                cmd.args([
                    "s_time",
                    "-new",
                    "-tls1_3",
                    "-ciphersuites",
                    "TLS_AES_128_GCM_SHA256",
                ])
                .arg("-connect")
                .arg(format!("127.0.0.1:{port}"))
                .arg("-www")
                .arg(&small)
                .arg("-time")
                .arg(secs.to_string());
                cmd
            })
            .collect();
        let (tool, tool_busy) = on_core(client, || run_tools(&target, cmds, "openssl s_time"));
        let (outs, cpu) = tool?;
        let (n, t) = sum_runs(&outs, parse_s_time, "openssl s_time")?;
        let rate = n as f64 / t.max(1e-9);
        let profile = TlsProfile::tls13_ecdsa();
        let (same_load, bench_busy) = on_core(client, || {
            Runner::measure(
                &mut target,
                "crosscheck",
                "handshake at s_time's rate",
                0,
                Job::Handshake(HandshakeJob {
                    addr,
                    server_name: SERVER_NAME.into(),
                    profile: profile.clone(),
                    path: small.clone(),
                    pacing: Pacing::Open {
                        per_second: rate.max(1.0),
                        max_in_flight: 4096,
                    },
                    window,
                    cores: opts.placement.client_cores.clone(),
                    // Eight s_time processes keep the generator's core busy
                    // (99–100 % measured), so the server's replies find them
                    // running; an open loop at ~1,000/s keeps it 13–30 %
                    // busy, and every reply would wake it, at the server's
                    // expense.
                    busy_poll: true,
                }),
            )
        });
        let same_load = same_load?;
        rows.push(row(
            results,
            *kind,
            ("handshake", &profile.label()),
            format!("{S_TIME_PROCESSES} × openssl s_time -new -tls1_3"),
            (n, t, cpu, tool_busy),
            (
                same_load.server_cpu_us_per_op,
                format!("open loop, {rate:.0}/s, generator polling"),
                bench_busy,
            ),
        ));
        // Keep-alive transfers of 1 KiB (issue 19's small requests) and
        // 64 KiB over 100 connections.
        let transfers = if !opts.targets.contains(kind) {
            Vec::new()
        } else {
            vec![("1k", &small), ("64k", &medium)]
        };
        for (size, path) in transfers {
            let mut cmd = tool_command(client, "wrk");
            cmd.arg("-t1")
                .arg(format!("-c{WRK_CONNECTIONS}"))
                .arg(format!("-d{secs}s"))
                .arg(format!("https://127.0.0.1:{port}{path}"));
            let (tool, tool_busy) = on_core(client, || run_tools(&target, vec![cmd], "wrk"));
            let (outs, cpu) = tool?;
            let (n, t) = sum_runs(&outs, parse_wrk, "wrk")?;
            let (same_load, bench_busy) = on_core(client, || {
                Runner::measure(
                    &mut target,
                    "crosscheck",
                    "transfer like wrk",
                    0,
                    Job::Transfer(TransferJob {
                        addr,
                        server_name: SERVER_NAME.into(),
                        profile: profile.clone(),
                        path: path.clone(),
                        connections: WRK_CONNECTIONS,
                        window,
                        cores: opts.placement.client_cores.clone(),
                    }),
                )
            });
            let same_load = same_load?;
            rows.push(row(
                results,
                *kind,
                ("transfer", size),
                format!("wrk -t1 -c{WRK_CONNECTIONS}"),
                (n, t, cpu, tool_busy),
                (
                    same_load.server_cpu_us_per_op,
                    format!("{WRK_CONNECTIONS} keep-alive connections"),
                    bench_busy,
                ),
            ));
        }
        drop(target);
        std::thread::sleep(Duration::from_millis(100));
    }
    results.crosschecks = rows;
    Ok(())
}

/// A cross-check row: the tool's `(operations, seconds, server CPU ns,
/// generator core busy)`, the bench's figure at the same load, what that
/// load was and how busy it kept the generator's core.
fn row(
    results: &Results,
    target: TargetKind,
    (scenario, case): (&str, &str),
    tool: String,
    (operations, secs, cpu_ns, tool_generator_busy): (u64, f64, u64, f64),
    (bench_cpu_us_per_op, bench_load, bench_generator_busy): (f64, String, f64),
) -> CrossCheck {
    CrossCheck {
        target,
        case: format!("{scenario} {case}"),
        tool,
        operations,
        secs,
        server_cpu_us_per_op: cpu_ns as f64 / 1e3 / operations.max(1) as f64,
        bench_cpu_us_per_op,
        bench_load,
        bench_saturated_cpu_us_per_op: results
            .summary(scenario, case, target)
            .map_or(0.0, |s| s.cpu_us_per_op),
        tool_generator_busy,
        bench_generator_busy,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_tools_outputs() {
        let s_time = "Collecting connection statistics for 3 seconds\n\
            tttt\n\n2013 connections in 2.05s; 981.95 connections/user sec, bytes read 2379366\n\
            2013 connections in 4 real seconds, 1182 bytes read per connection\n";
        assert_eq!(parse_s_time(s_time), Some((2013, 4.0)));
        let wrk = "Running 3s test @ https://127.0.0.1:1/f/64k\n  1 threads and 100 connections\n\
            \x20 9262 requests in 3.02s, 579.22MB read\nRequests/sec:   3066.70\n";
        assert_eq!(parse_wrk(wrk), Some((9262, 3.02)));
        assert_eq!(parse_wrk("garbage"), None);
        let refused = format!("{wrk}  Non-2xx or 3xx responses: 12\n");
        assert_eq!(parse_wrk(&refused), None);
    }
}
