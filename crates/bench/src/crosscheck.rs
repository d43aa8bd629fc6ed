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

use std::process::{Child, Command};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use tlsgate_loadgen::{HandshakeJob, Pacing, TlsProfile, TransferJob, Window};

use crate::error::BenchError;
use crate::materials::{Materials, SERVER_NAME};
use crate::proc::CoreTicks;
use crate::report::{median, Cell, Results};
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
    /// Operations the tool completed, over all rounds.
    pub operations: u64,
    /// Its run time, seconds, over all rounds.
    pub secs: f64,
    /// Server CPU per operation during the tool's runs, µs (median).
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
    /// Operations per second the bench's generator completed at the
    /// tool's load (beside the tool's own rate: the loads were alike).
    #[serde(default)]
    pub bench_ops_per_sec: f64,
    /// Every round; the figures above are their medians (operations and
    /// seconds, their sums).
    #[serde(default)]
    pub rounds: Vec<Round>,
}

/// One round of a cross-check: the tool's run, then the bench's generator
/// at the same load.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Round {
    /// Operations the tool completed.
    pub tool_operations: u64,
    /// The tool's run time, seconds.
    pub tool_secs: f64,
    /// Server CPU per operation under the tool, µs.
    pub tool_cpu_us_per_op: f64,
    /// Server CPU per operation under the bench's generator, µs.
    pub bench_cpu_us_per_op: f64,
    /// The bench generator's operations per second.
    pub bench_ops_per_sec: f64,
    /// The generator core's busy share under the tool.
    pub tool_generator_busy: f64,
    /// The same under the bench's generator.
    pub bench_generator_busy: f64,
}

/// Busy share of `core` while `f` runs (0 without a core).
pub(crate) fn on_core<T>(core: Option<usize>, f: impl FnOnce() -> T) -> (T, f64) {
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
    let children = spawn_tools(cmds, what)?;
    let outs = collect_tools(target, children, what)?;
    let cpu = target.tree().cpu_ns().saturating_sub(before);
    Ok((outs, cpu))
}

/// What a tool's run measured in its steady state.
pub(crate) struct Steady {
    /// Each process's standard output.
    pub outs: Vec<String>,
    /// The server's CPU over the steady window, ns.
    pub cpu_ns: u64,
    /// The steady window, seconds.
    pub window_secs: f64,
    /// From the first spawn to the last exit, seconds.
    pub wall_secs: f64,
}

/// Runs the commands in parallel for about `secs` (their own duration
/// option) and samples the target's CPU over their steady state only,
/// from a fifth into the run to a tenth before its end: the bench's cells
/// leave warm-up out too, and a tool's start (its connections, its
/// handshakes) and end fall outside the operations it counts. Measured
/// over the whole run, `wrk`'s 64 KiB figures implied more than the one
/// core nginx and HAProxy run on.
pub(crate) fn run_tools_steady(
    target: &Target,
    cmds: Vec<Command>,
    what: &str,
    secs: f64,
) -> Result<Steady, BenchError> {
    let began = std::time::Instant::now();
    let mut children = spawn_tools(cmds, what)?;
    let sample = |at: Duration| {
        let due = began + at;
        if let Some(wait) = due.checked_duration_since(std::time::Instant::now()) {
            std::thread::sleep(wait);
        }
        (target.tree().cpu_ns(), std::time::Instant::now())
    };
    let (cpu_open, open) = sample(Duration::from_secs_f64(secs * 0.2));
    let (cpu_close, close) = sample(Duration::from_secs_f64(secs * 0.9));
    let ended = children
        .iter_mut()
        .any(|c| !matches!(c.try_wait(), Ok(None)));
    if ended {
        // A window with the load gone would hold idle time; a tool that
        // failed says why first.
        collect_tools(target, children, what)?;
        return Err(BenchError::Other(format!(
            "{what} against {} ended before its {secs} s were over",
            target.kind()
        )));
    }
    let outs = collect_tools(target, children, what)?;
    Ok(Steady {
        outs,
        cpu_ns: cpu_close.saturating_sub(cpu_open),
        window_secs: (close - open).as_secs_f64(),
        wall_secs: began.elapsed().as_secs_f64(),
    })
}

impl Steady {
    /// Server CPU per operation, µs, at the tool's `rate` (operations per
    /// second) over the steady window.
    pub fn cpu_per_op(&self, rate: f64) -> f64 {
        let ops = rate * self.window_secs;
        if ops > 0.0 {
            self.cpu_ns as f64 / 1e3 / ops
        } else {
            0.0
        }
    }
}

fn spawn_tools(cmds: Vec<Command>, what: &str) -> Result<Vec<Child>, BenchError> {
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
    Ok(children)
}

/// Waits for every child; their outputs, or an error naming the first
/// that failed.
fn collect_tools(
    target: &Target,
    children: Vec<Child>,
    what: &str,
) -> Result<Vec<String>, BenchError> {
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
    Ok(outs)
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
/// generator at the same load; `opts.crosscheck_rounds` rounds, the targets taking
/// turns in each, and every figure the median of its rounds. One 3 s cell
/// moves by ±20 % on this shared machine: a single round decided nothing.
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
    let mut checks: Vec<CrossCheck> = Vec::new();
    for repeat in 0..opts.crosscheck_rounds.max(1) {
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
            let (tool, tool_busy) = on_core(client, || {
                run_tools_steady(&target, cmds, "openssl s_time", secs as f64)
            });
            let tool = tool?;
            // s_time's own "real seconds" are whole seconds (3 or 4 for a
            // 3 s run): the rate is over the processes' wall time.
            let (n, _) = sum_runs(&tool.outs, parse_s_time, "openssl s_time")?;
            let t = tool.wall_secs;
            let rate = n as f64 / t.max(1e-9);
            let profile = TlsProfile::tls13_ecdsa();
            let (same_load, bench_busy) = on_core(client, || {
                Runner::measure(
                    &mut target,
                    "crosscheck",
                    "handshake at s_time's rate",
                    repeat,
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
                        // Eight s_time processes keep the generator's core
                        // busy (99–100 % measured), so the server's replies
                        // find them running; an open loop at ~1,000/s keeps
                        // it 13–30 % busy, and every reply would wake it, at
                        // the server's expense.
                        busy_poll: true,
                    }),
                )
            });
            let same_load = same_load?;
            record(
                &mut checks,
                results,
                *kind,
                ("handshake", &profile.label()),
                format!("{S_TIME_PROCESSES} × openssl s_time -new -tls1_3"),
                "open loop at s_time's rate, generator polling".to_string(),
                Round::of(
                    (n, t, tool.cpu_per_op(rate), tool_busy),
                    &same_load,
                    bench_busy,
                ),
            );
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
                let (tool, tool_busy) = on_core(client, || {
                    run_tools_steady(&target, vec![cmd], "wrk", secs as f64)
                });
                let tool = tool?;
                let (n, t) = sum_runs(&tool.outs, parse_wrk, "wrk")?;
                let rate = n as f64 / t.max(1e-9);
                let (same_load, bench_busy) = on_core(client, || {
                    Runner::measure(
                        &mut target,
                        "crosscheck",
                        "transfer like wrk",
                        repeat,
                        Job::Transfer(TransferJob {
                            addr,
                            server_name: SERVER_NAME.into(),
                            profile: profile.clone(),
                            path: path.clone(),
                            connections: WRK_CONNECTIONS,
                            window,
                            cores: opts.placement.client_cores.clone(),
                            // wrk's rate: the bench's generator is the
                            // cheaper client and would otherwise load the
                            // server more (+20–35 % requests per second
                            // measured), and CPU per request falls with
                            // load. Polling as wrk keeps its core busy.
                            per_second: Some(rate.max(1.0)),
                            busy_poll: true,
                        }),
                    )
                });
                let same_load = same_load?;
                record(
                    &mut checks,
                    results,
                    *kind,
                    ("transfer", size),
                    format!("wrk -t1 -c{WRK_CONNECTIONS}"),
                    format!(
                        "{WRK_CONNECTIONS} keep-alive connections at wrk's rate, generator polling"
                    ),
                    Round::of(
                        (n, t, tool.cpu_per_op(rate), tool_busy),
                        &same_load,
                        bench_busy,
                    ),
                );
            }
            drop(target);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    for check in &mut checks {
        check.settle();
    }
    results.crosschecks = checks;
    Ok(())
}

/// Adds a round to its cross-check (target, case and tool), starting one
/// (with the bench's saturated figure for the case, from `results`) if it
/// is the first.
fn record(
    checks: &mut Vec<CrossCheck>,
    results: &Results,
    target: TargetKind,
    (scenario, case): (&str, &str),
    tool: String,
    bench_load: String,
    round: Round,
) {
    let saturated = results
        .summary(scenario, case, target)
        .map_or(0.0, |s| s.cpu_us_per_op);
    let case = format!("{scenario} {case}");
    let at = match checks
        .iter()
        .position(|c| c.target == target && c.case == case && c.tool == tool)
    {
        Some(at) => at,
        None => {
            checks.push(CrossCheck {
                target,
                case,
                tool,
                operations: 0,
                secs: 0.0,
                server_cpu_us_per_op: 0.0,
                bench_cpu_us_per_op: 0.0,
                bench_load,
                bench_saturated_cpu_us_per_op: saturated,
                tool_generator_busy: 0.0,
                bench_generator_busy: 0.0,
                bench_ops_per_sec: 0.0,
                rounds: Vec::new(),
            });
            checks.len() - 1
        }
    };
    checks[at].rounds.push(round);
}

impl Round {
    /// The tool's `(operations, seconds, server CPU µs per operation,
    /// generator core busy)` and the bench's cell at the same load with
    /// its busy share.
    fn of(
        (operations, secs, tool_cpu_us_per_op, tool_generator_busy): (u64, f64, f64, f64),
        bench: &Cell,
        bench_generator_busy: f64,
    ) -> Self {
        Round {
            tool_operations: operations,
            tool_secs: secs,
            tool_cpu_us_per_op,
            bench_cpu_us_per_op: bench.server_cpu_us_per_op,
            bench_ops_per_sec: bench.load.operations as f64 / bench.load.window_secs.max(1e-9),
            tool_generator_busy,
            bench_generator_busy,
        }
    }
}

impl CrossCheck {
    /// Sets the figures from the rounds: medians, and the tool's
    /// operations and seconds summed.
    fn settle(&mut self) {
        let of = |f: fn(&Round) -> f64| median(self.rounds.iter().map(f).collect());
        self.server_cpu_us_per_op = of(|r| r.tool_cpu_us_per_op);
        self.bench_cpu_us_per_op = of(|r| r.bench_cpu_us_per_op);
        self.bench_ops_per_sec = of(|r| r.bench_ops_per_sec);
        self.tool_generator_busy = of(|r| r.tool_generator_busy);
        self.bench_generator_busy = of(|r| r.bench_generator_busy);
        self.operations = self.rounds.iter().map(|r| r.tool_operations).sum();
        self.secs = self.rounds.iter().map(|r| r.tool_secs).sum();
    }

    /// The tool's operations per second: the median of its rounds, as the
    /// bench's beside it (over all rounds for results without them).
    pub fn tool_ops_per_sec(&self) -> f64 {
        if self.rounds.is_empty() {
            return self.operations as f64 / self.secs.max(1e-9);
        }
        median(
            self.rounds
                .iter()
                .map(|r| r.tool_operations as f64 / r.tool_secs.max(1e-9))
                .collect(),
        )
    }

    /// The tool's server CPU per operation over the bench's at the same
    /// load, the median of the rounds' (the ratio of the medians for
    /// results without rounds).
    pub fn paired_ratio_tool_to_bench(&self) -> Option<f64> {
        let ratios: Vec<f64> = self
            .rounds
            .iter()
            .filter(|r| r.tool_cpu_us_per_op > 0.0 && r.bench_cpu_us_per_op > 0.0)
            .map(|r| r.tool_cpu_us_per_op / r.bench_cpu_us_per_op)
            .collect();
        if !ratios.is_empty() {
            return Some(median(ratios));
        }
        (self.server_cpu_us_per_op > 0.0 && self.bench_cpu_us_per_op > 0.0)
            .then(|| self.server_cpu_us_per_op / self.bench_cpu_us_per_op)
    }

    /// This check's figure over `other`'s, the median of each round's
    /// pair (the two ran in the same round, minutes apart at most), so
    /// the machine's drift between rounds stays out of the ratio. Results
    /// without rounds (older files) give the ratio of the medians.
    pub fn paired_ratio(&self, other: &CrossCheck, tool: bool) -> Option<f64> {
        let figure = |r: &Round| {
            if tool {
                r.tool_cpu_us_per_op
            } else {
                r.bench_cpu_us_per_op
            }
        };
        let ratios: Vec<f64> = self
            .rounds
            .iter()
            .zip(&other.rounds)
            .filter(|(a, b)| figure(a) > 0.0 && figure(b) > 0.0)
            .map(|(a, b)| figure(a) / figure(b))
            .collect();
        if !ratios.is_empty() {
            return Some(median(ratios));
        }
        let (a, b) = if tool {
            (self.server_cpu_us_per_op, other.server_cpu_us_per_op)
        } else {
            (self.bench_cpu_us_per_op, other.bench_cpu_us_per_op)
        };
        (a > 0.0 && b > 0.0).then(|| a / b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(tool: f64, bench: f64) -> Round {
        Round {
            tool_operations: 1000,
            tool_secs: 3.0,
            tool_cpu_us_per_op: tool,
            bench_cpu_us_per_op: bench,
            bench_ops_per_sec: 700.0,
            tool_generator_busy: 0.99,
            bench_generator_busy: 0.97,
        }
    }

    /// Rounds of one target, case and tool fold into one check: medians
    /// of the figures, sums of operations and seconds; ratios pair the
    /// rounds.
    #[test]
    fn rounds_fold_into_medians_and_pair_by_round() {
        let mut checks = Vec::new();
        let results = Results::new(crate::report::Machine::detect("test".into()), true);
        let case = ("handshake", "TLS1.3 ECDSA full");
        for (target, tool, bench) in [
            (TargetKind::Tlsgate, 100.0, 120.0),
            (TargetKind::Nginx, 200.0, 200.0),
            (TargetKind::Tlsgate, 200.0, 150.0),
            (TargetKind::Nginx, 500.0, 300.0),
            (TargetKind::Tlsgate, 300.0, 200.0),
            (TargetKind::Nginx, 500.0, 500.0),
        ] {
            let r = round(tool, bench);
            let (tool, load) = ("s_time".into(), "open".into());
            record(&mut checks, &results, target, case, tool, load, r);
        }
        for c in &mut checks {
            c.settle();
        }
        assert_eq!(checks.len(), 2);
        let (t, n) = (&checks[0], &checks[1]);
        assert_eq!(
            (t.target, n.target),
            (TargetKind::Tlsgate, TargetKind::Nginx)
        );
        assert_eq!((t.operations, t.secs, t.rounds.len()), (3000, 9.0, 3));
        assert_eq!(
            (t.server_cpu_us_per_op, t.bench_cpu_us_per_op),
            (200.0, 150.0)
        );
        assert_eq!(t.case, "handshake TLS1.3 ECDSA full");
        // Per round tlsgate ÷ nginx by the tool: 0.5, 0.4, 0.6; the ratio
        // of the medians would read 200 / 500 = 0.4.
        assert_eq!(t.paired_ratio(n, true), Some(0.5));
        // By the bench: 0.6, 0.5, 0.4.
        assert_eq!(t.paired_ratio(n, false), Some(0.5));
        // Tool ÷ bench per round: 0.83, 1.33, 1.5.
        assert_eq!(t.paired_ratio_tool_to_bench(), Some(200.0 / 150.0));
        // 1,000 operations in 3 s each round.
        assert!((t.tool_ops_per_sec() - 1000.0 / 3.0).abs() < 1e-9);
        // A missing figure in a round leaves that round out.
        checks[1].rounds[1].tool_cpu_us_per_op = 0.0;
        assert_eq!(checks[0].paired_ratio(&checks[1], true), Some(0.55));
    }

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
