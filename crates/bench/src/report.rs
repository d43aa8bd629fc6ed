//! Results: every measured cell, medians over repeats, ratios to nginx, the
//! machine they were measured on; written as JSON and Markdown.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::Path;

use serde::{Deserialize, Serialize};
use tlsgate_loadgen::Report;

use crate::bound::Bounds;
use crate::crosscheck::CrossCheck;
use crate::error::BenchError;
use crate::targets::TargetKind;

/// Issue 19's bound on key isolation's cost with the server saturated.
const ISOLATION_SATURATED: f64 = 0.10;
/// The same where the server is partly idle (`openssl s_time`'s load).
const ISOLATION_IDLE: f64 = 0.15;
/// How far a tool's tlsgate ÷ nginx may be from the bench's at the same
/// load before the report says they disagree (two runs of one bench cell
/// move up to ~10 % here).
const AGREEMENT: f64 = 0.15;

/// How much more `cost` is than `base` (0.1 for 10 %), if `base` was measured.
fn excess(cost: f64, base: f64) -> Option<f64> {
    (base > 0.0).then(|| cost / base - 1.0)
}

/// A generator that keeps its own cores this busy while the server is
/// below [`SERVER_BUSY`] is the bottleneck, not the server.
pub const CLIENT_SATURATED: f64 = 0.90;
/// Server utilization (of its one core) considered saturated.
pub const SERVER_BUSY: f64 = 0.90;

/// Whether a generator this busy (its cores' share) limited a server this
/// busy (its CPU ÷ wall time): [`CLIENT_SATURATED`] against [`SERVER_BUSY`].
pub fn generator_limited(generator_busy: f64, server_busy: f64) -> bool {
    generator_busy >= CLIENT_SATURATED && server_busy < SERVER_BUSY
}

/// One measurement: one target, one case, one repeat.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Cell {
    /// "handshake", "transfer", "stream".
    pub scenario: String,
    /// e.g. "TLS1.3 ECDSA full", "64k", "1000 conns".
    pub case: String,
    /// Which server.
    pub target: TargetKind,
    /// Repeat number.
    pub repeat: usize,
    /// The generator's report.
    pub load: Report,
    /// Server CPU over the window (all processes and threads), seconds.
    pub server_cpu_secs: f64,
    /// Server CPU / window: 1.0 is one core saturated.
    pub server_utilization: f64,
    /// Server CPU per operation, microseconds.
    pub server_cpu_us_per_op: f64,
    /// Server CPU per received byte, nanoseconds.
    pub server_cpu_ns_per_byte: f64,
    /// Server PSS before the load started, bytes.
    pub pss_before: u64,
    /// Server PSS when the window opened, bytes.
    pub pss_open: u64,
    /// Server PSS when the window closed, bytes.
    pub pss_close: u64,
    /// The generator, not the server, limited this measurement.
    pub generator_bound: bool,
}

impl Cell {
    /// Derives the per-operation figures.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        scenario: &str,
        case: &str,
        target: TargetKind,
        repeat: usize,
        load: Report,
        server_cpu_ns: u64,
        pss_before: u64,
        pss_open: u64,
        pss_close: u64,
    ) -> Self {
        let server_cpu_secs = server_cpu_ns as f64 / 1e9;
        let server_utilization = ratio(server_cpu_secs, load.window_secs);
        let generator_bound = generator_limited(load.client_utilization(), server_utilization);
        Self {
            scenario: scenario.into(),
            case: case.into(),
            target,
            repeat,
            server_cpu_us_per_op: ratio(server_cpu_secs * 1e6, load.operations as f64),
            server_cpu_ns_per_byte: ratio(server_cpu_secs * 1e9, load.bytes as f64),
            server_cpu_secs,
            server_utilization,
            pss_before,
            pss_open,
            pss_close,
            generator_bound,
            load,
        }
    }
}

fn extra(c: &Cell, key: &str) -> f64 {
    c.load.extra.get(key).copied().unwrap_or(0.0)
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

/// Medians over the repeats of one case on one target.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// Scenario.
    pub scenario: String,
    /// Case.
    pub case: String,
    /// Target.
    pub target: TargetKind,
    /// Repeats measured.
    pub repeats: usize,
    /// Operations per second.
    pub ops_per_sec: f64,
    /// Bytes per second received.
    pub bytes_per_sec: f64,
    /// Server CPU per operation, µs.
    pub cpu_us_per_op: f64,
    /// Server CPU per byte, ns.
    pub cpu_ns_per_byte: f64,
    /// Bytes per server CPU-second.
    pub bytes_per_cpu_sec: f64,
    /// Latency p50, µs.
    pub p50_us: f64,
    /// Latency p99, µs.
    pub p99_us: f64,
    /// Server utilization.
    pub server_utilization: f64,
    /// Generator utilization.
    pub client_utilization: f64,
    /// Share of handshakes resumed.
    pub resumed_share: f64,
    /// Failed operations per completed one.
    pub error_rate: f64,
    /// Server PSS at window close, bytes.
    pub pss_bytes: f64,
    /// PSS added per open connection (stream), bytes.
    pub pss_per_connection: f64,
    /// Connections open when the window opened (stream, idle).
    #[serde(default)]
    pub connections_open: f64,
    /// Fetches slower than their interval (stream), per second.
    pub late_per_sec: f64,
    /// Any repeat was generator-bound.
    pub generator_bound: bool,
    /// CPU per operation of what ran beside the target (the proxy
    /// scenario's upstream), µs.
    #[serde(default)]
    pub beside_cpu_us_per_op: f64,
    /// Busy share of the generator's core, where measured (proxy).
    #[serde(default)]
    pub client_core_busy: f64,
}

/// Median of the values (0 for none).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

impl Summary {
    fn of(cells: &[&Cell]) -> Self {
        let m = |f: &dyn Fn(&Cell) -> f64| median(cells.iter().map(|c| f(c)).collect());
        let first = cells[0];
        Self {
            scenario: first.scenario.clone(),
            case: first.case.clone(),
            target: first.target,
            repeats: cells.len(),
            ops_per_sec: m(&|c| c.load.ops_per_sec()),
            bytes_per_sec: m(&|c| c.load.bytes_per_sec()),
            cpu_us_per_op: m(&|c| c.server_cpu_us_per_op),
            cpu_ns_per_byte: m(&|c| c.server_cpu_ns_per_byte),
            bytes_per_cpu_sec: m(&|c| ratio(c.load.bytes as f64, c.server_cpu_secs)),
            p50_us: m(&|c| c.load.latency.p50_us),
            p99_us: m(&|c| c.load.latency.p99_us),
            server_utilization: m(&|c| c.server_utilization),
            client_utilization: m(&|c| c.load.client_utilization()),
            resumed_share: m(&|c| c.load.resumed_share()),
            error_rate: m(&|c| ratio(c.load.error_count() as f64, c.load.operations as f64)),
            pss_bytes: m(&|c| c.pss_close as f64),
            connections_open: m(&|c| extra(c, "connections_open")),
            pss_per_connection: m(&|c| {
                let open = c.load.extra.get("connections_open").copied().unwrap_or(0.0);
                ratio(c.pss_open.saturating_sub(c.pss_before) as f64, open)
            }),
            late_per_sec: m(&|c| {
                ratio(
                    c.load.extra.get("late_fetches").copied().unwrap_or(0.0),
                    c.load.window_secs,
                )
            }),
            generator_bound: cells.iter().any(|c| c.generator_bound),
            beside_cpu_us_per_op: m(&|c| extra(c, "beside_cpu_us_per_op")),
            client_core_busy: m(&|c| extra(c, "client_core_busy")),
        }
    }
}

/// Where the results were measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    /// CPU model.
    pub cpu: String,
    /// Online cores.
    pub cores: usize,
    /// Kernel release.
    pub kernel: String,
    /// When (UTC, RFC 3339).
    pub date: String,
    /// Server core and generator cores.
    pub placement: String,
    /// TCP's congestion control and the default qdisc. BBR paces every
    /// connection, and over loopback (no qdisc) it does so with a timer per
    /// socket: on this project's VM that made a 1 MiB response cost 1.5×
    /// per byte what it cost under cubic (docs/bench.md). Empty in results
    /// from before it was recorded.
    #[serde(default)]
    pub tcp: String,
}

impl Machine {
    /// Describes this machine.
    pub fn detect(placement: String) -> Self {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split(':').nth(1))
            .unwrap_or("unknown")
            .trim()
            .to_string();
        let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string();
        let date = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        let sysctl = |name: &str| {
            fs::read_to_string(format!("/proc/sys/{name}"))
                .map_or_else(|_| "unknown".to_string(), |v| v.trim().to_string())
        };
        let tcp = format!(
            "congestion control {}, default qdisc {}",
            sysctl("net/ipv4/tcp_congestion_control"),
            sysctl("net/core/default_qdisc")
        );
        Self {
            cpu,
            cores: core_affinity::get_core_ids().map_or(1, |c| c.len()),
            kernel,
            date,
            placement,
            tcp,
        }
    }
}

/// Everything one `tlsgate bench` run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Results {
    /// The machine.
    pub machine: Machine,
    /// Version line of each target.
    pub versions: BTreeMap<String, String>,
    /// Quick smoke run (figures are not meant to be compared).
    pub quick: bool,
    /// Every cell.
    pub cells: Vec<Cell>,
    /// Medians per case and target.
    pub summaries: Vec<Summary>,
    /// The physical floor, when measured.
    pub bounds: Option<Bounds>,
    /// Independent measurements with openssl s_time and wrk.
    #[serde(default)]
    pub crosschecks: Vec<CrossCheck>,
    /// The h2 scenario (h2load).
    #[serde(default)]
    pub h2: Vec<crate::h2::H2Row>,
}

impl Results {
    /// Empty results for this machine.
    pub fn new(machine: Machine, quick: bool) -> Self {
        Self {
            machine,
            versions: BTreeMap::new(),
            quick,
            cells: Vec::new(),
            summaries: Vec::new(),
            bounds: None,
            crosschecks: Vec::new(),
            h2: Vec::new(),
        }
    }

    /// Recomputes the medians.
    pub fn summarize(&mut self) {
        let mut groups: BTreeMap<(String, String, TargetKind), Vec<&Cell>> = BTreeMap::new();
        let mut order: Vec<(String, String, TargetKind)> = Vec::new();
        for c in &self.cells {
            let k = (c.scenario.clone(), c.case.clone(), c.target);
            if !groups.contains_key(&k) {
                order.push(k.clone());
            }
            groups.entry(k).or_default().push(c);
        }
        self.summaries = order.iter().map(|k| Summary::of(&groups[k])).collect();
    }

    /// The summary of one case on one target.
    pub fn summary(&self, scenario: &str, case: &str, target: TargetKind) -> Option<&Summary> {
        self.summaries
            .iter()
            .find(|s| s.scenario == scenario && s.case == case && s.target == target)
    }

    /// Cases of a scenario, in measurement order.
    pub fn cases(&self, scenario: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for s in self.summaries.iter().filter(|s| s.scenario == scenario) {
            if !out.contains(&s.case) {
                out.push(s.case.clone());
            }
        }
        out
    }

    /// Targets present in the results, in report order.
    pub fn targets(&self) -> Vec<TargetKind> {
        TargetKind::REPORTED
            .into_iter()
            .filter(|t| self.summaries.iter().any(|s| s.target == *t))
            .collect()
    }

    /// Targets measured in `scenario`, in report order.
    pub fn targets_in(&self, scenario: &str) -> Vec<TargetKind> {
        TargetKind::REPORTED
            .into_iter()
            .filter(|t| {
                self.summaries
                    .iter()
                    .any(|s| s.scenario == scenario && s.target == *t)
            })
            .collect()
    }

    /// Writes `results.json` and `report.md` into `dir`.
    pub fn write(&self, dir: &Path) -> Result<(), BenchError> {
        fs::create_dir_all(dir).map_err(BenchError::io(dir))?;
        let json = dir.join("results.json");
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| BenchError::Other(format!("serializing results: {e}")))?;
        fs::write(&json, text).map_err(BenchError::io(&json))?;
        let md = dir.join("report.md");
        fs::write(&md, self.markdown()).map_err(BenchError::io(&md))?;
        Ok(())
    }

    /// The Markdown report.
    pub fn markdown(&self) -> String {
        let mut out = String::new();
        let m = &self.machine;
        let _ = writeln!(
            out,
            "# tlsgate bench{}\n",
            if self.quick {
                " (quick smoke run: figures not comparable)"
            } else {
                ""
            }
        );
        let _ = writeln!(
            out,
            "Measured {} on {} ({} cores), kernel {}; {}.  ",
            m.date, m.cpu, m.cores, m.kernel, m.placement
        );
        if !m.tcp.is_empty() {
            let _ = writeln!(out, "TCP: {}.  ", m.tcp);
            if m.tcp.starts_with("congestion control bbr") {
                let _ = writeln!(
                    out,
                    "⚠ BBR paces every loopback connection with a timer of its own: big transfers cost more per byte than under cubic, and not alike for every target (docs/bench.md, \"TCP's congestion control\").  "
                );
            }
        }
        for (t, v) in &self.versions {
            let _ = writeln!(out, "- {t}: {v}");
        }
        let _ = writeln!(
            out,
            "\nServer CPU is the scheduler's run time of every thread of every process of the target (/proc/PID/task/*/schedstat), over the measurement window only. Each figure is the median of the repeats; ratios are tlsgate ÷ nginx (lower CPU is better). ⚠ marks a generator-bound cell (the generator, not the server, was the limit)."
        );
        self.handshake_table(&mut out, &self.targets_in("handshake"));
        self.latency_table(&mut out, &self.targets_in("latency"));
        self.isolation_table(&mut out);
        self.transfer_table(&mut out, &self.targets_in("transfer"));
        self.stream_table(&mut out, &self.targets_in("stream"));
        self.idle_table(&mut out, &self.targets_in(crate::scenario::IDLE));
        self.h2_table(&mut out);
        self.proxy_table(&mut out, &self.targets_in("proxy"));
        if !self.crosschecks.is_empty() {
            let _ = writeln!(
                out,
                "\n## Cross-check: the field's tools against the same targets\n\nServer CPU per operation while `openssl s_time` or `wrk` (pinned to the generator's core) drove the target, next to the bench's own generator driving the same target at the same load right after (s_time's rate, open loop, polling as s_time's processes keep the core busy; wrk's connections). CPU per operation depends on load: s_time keeps a server partly idle, so the bench's saturated figure (last column, from this run's handshake or transfer scenario) is not the one to compare with. So does whether the server's replies find the client running or must wake it: the generator core's busy share is shown for both. Every figure is the median of the rounds (the targets take turns in each round); one 3 s round moves by ±20 % on a shared machine.\n\n| target | case | tool | rounds | ops/s, tool / bench | server CPU µs/op | bench at the same load | bench CPU µs/op | tool ÷ bench | generator core busy, tool / bench | bench saturated µs/op |\n|---|---|---|---:|---:|---:|---|---:|---:|---:|---:|"
            );
            for c in &self.crosschecks {
                let ratio = match c.paired_ratio_tool_to_bench() {
                    Some(r) => format!("{r:.2}"),
                    None => "–".into(),
                };
                let saturated = if c.bench_saturated_cpu_us_per_op > 0.0 {
                    format!("{:.1}", c.bench_saturated_cpu_us_per_op)
                } else {
                    "–".into()
                };
                let _ = writeln!(
                    out,
                    "| {} | {} | `{}` | {} | {:.0} / {:.0} | {:.1} | {} | {:.1} | {ratio} | {:.0} % / {:.0} % | {saturated} |",
                    c.target,
                    c.case,
                    c.tool,
                    c.rounds.len().max(1),
                    c.tool_ops_per_sec(),
                    c.bench_ops_per_sec,
                    c.server_cpu_us_per_op,
                    c.bench_load,
                    c.bench_cpu_us_per_op,
                    c.tool_generator_busy * 100.0,
                    c.bench_generator_busy * 100.0
                );
            }
        }
        self.agreement_table(&mut out);
        if let Some(b) = &self.bounds {
            let _ = writeln!(out, "\n## Bound: the floor on this machine\n");
            let _ = writeln!(out, "{}", b.markdown());
        }
        out
    }

    fn ratio_to_nginx(&self, scenario: &str, case: &str, f: fn(&Summary) -> f64) -> String {
        match (
            self.summary(scenario, case, TargetKind::Tlsgate),
            self.summary(scenario, case, TargetKind::Nginx),
        ) {
            (Some(t), Some(n)) if f(n) > 0.0 => format!("{:.2}", f(t) / f(n)),
            _ => "–".into(),
        }
    }

    /// `f` of `a`'s cell over `f` of `b`'s, for every repeat of the case
    /// that measured both (a figure of 0 is no measure).
    fn paired_ratios(
        &self,
        (scenario, case): (&str, &str),
        (a, b): (TargetKind, TargetKind),
        f: fn(&Cell) -> f64,
    ) -> Vec<f64> {
        let of = |target: TargetKind| {
            self.cells
                .iter()
                .filter(move |c| c.scenario == scenario && c.case == case && c.target == target)
        };
        of(a)
            .filter_map(|x| {
                let y = of(b).find(|y| y.repeat == x.repeat)?;
                (f(x) > 0.0 && f(y) > 0.0).then(|| f(x) / f(y))
            })
            .collect()
    }

    /// tlsgate ÷ nginx by `f` of their cells, the median of each repeat's
    /// pair: a repeat runs every target's cell within seconds, while the
    /// machine's speed drifts between repeats, and the ratio of the two
    /// medians can pair a fast repeat of one with a slow one of the other
    /// (keep-alive 1 KiB, 2026-11-27 12:14: pairs 1.71, 1.52 and 1.25×
    /// nginx's bytes per CPU-second, the medians' ratio 1.26×). Falls back
    /// to the medians' ratio when no repeat has both.
    fn paired_ratio_to_nginx(
        &self,
        scenario: &str,
        case: &str,
        f: fn(&Cell) -> f64,
        of_summaries: fn(&Summary) -> f64,
    ) -> String {
        let paired = self.paired_ratios(
            (scenario, case),
            (TargetKind::Tlsgate, TargetKind::Nginx),
            f,
        );
        if paired.is_empty() {
            self.ratio_to_nginx(scenario, case, of_summaries)
        } else {
            format!("{:.2}", median(paired))
        }
    }

    fn handshake_table(&self, out: &mut String, targets: &[TargetKind]) {
        let cases = self.cases("handshake");
        if cases.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\n## Handshakes: a new connection per request (one small GET)\n"
        );
        let _ = write!(out, "| handshake |");
        for t in targets {
            let _ = write!(out, " {t} hs/s | {t} CPU µs/hs | {t} p50/p99 ms |");
        }
        let _ = writeln!(
            out,
            " tlsgate÷nginx CPU | key isolation's cost | bound µs |"
        );
        let _ = write!(out, "|---|");
        for _ in targets {
            let _ = write!(out, "---:|---:|---:|");
        }
        let _ = writeln!(out, "---:|---:|---:|");
        for case in &cases {
            let _ = write!(out, "| {case} |");
            for t in targets {
                match self.summary("handshake", case, *t) {
                    Some(s) => {
                        let warn = if s.generator_bound { " ⚠" } else { "" };
                        let resumed = if case.contains("resumed") && s.resumed_share < 0.95 {
                            format!(" (resumed {:.0} %)", s.resumed_share * 100.0)
                        } else {
                            String::new()
                        };
                        let _ = write!(
                            out,
                            " {:.0}{warn} | {:.0}{resumed} | {:.2}/{:.2} |",
                            s.ops_per_sec,
                            s.cpu_us_per_op,
                            s.p50_us / 1e3,
                            s.p99_us / 1e3
                        );
                    }
                    None => {
                        let _ = write!(out, " – | – | – |");
                    }
                }
            }
            let bound = self
                .bounds
                .as_ref()
                .and_then(|b| b.handshake_us(case))
                .map_or("–".into(), |v| format!("{v:.0}"));
            let _ = writeln!(
                out,
                " {} | {} | {bound} |",
                self.paired_ratio_to_nginx(
                    "handshake",
                    case,
                    |c| c.server_cpu_us_per_op,
                    |s| s.cpu_us_per_op
                ),
                self.isolation_cost("handshake", case)
                    .map_or("–".into(), |c| format!("{:+.0} %", c * 100.0))
            );
        }
    }

    /// Whether the field's tools and the bench's generator, at the same
    /// load, rank tlsgate against nginx alike: the tool's tlsgate ÷ nginx
    /// over the bench's, per cross-checked case.
    fn agreement_table(&self, out: &mut String) {
        let measured =
            |c: &&CrossCheck| c.server_cpu_us_per_op > 0.0 && c.bench_cpu_us_per_op > 0.0;
        let mut rows = Vec::new();
        for t in self
            .crosschecks
            .iter()
            .filter(|c| c.target == TargetKind::Tlsgate)
            .filter(measured)
        {
            let nginx = self
                .crosschecks
                .iter()
                .filter(measured)
                .find(|c| c.target == TargetKind::Nginx && c.case == t.case);
            let paired =
                nginx.and_then(|n| Some((t.paired_ratio(n, true)?, t.paired_ratio(n, false)?)));
            if let Some((tool, bench)) = paired {
                rows.push((t.case.clone(), t.tool.clone(), tool, bench));
            }
        }
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\nDo the tools and the bench agree? tlsgate ÷ nginx server CPU per operation by each, at the same load (the median of each round's pair); they agree when the two ratios are within {:.0} % of each other.\n\n| case | tool | tlsgate ÷ nginx, tool | tlsgate ÷ nginx, bench | tool ÷ bench | agree |\n|---|---|---:|---:|---:|---|",
            AGREEMENT * 100.0
        );
        for (case, tool, by_tool, by_bench) in rows {
            let r = by_tool / by_bench;
            let _ = writeln!(
                out,
                "| {case} | `{tool}` | {by_tool:.2} | {by_bench:.2} | {r:.2} | {} |",
                if (r - 1.0).abs() <= AGREEMENT {
                    "yes"
                } else {
                    "**no**"
                }
            );
        }
    }

    /// What keeping the keys out of the worker costs in a cell: tlsgate's
    /// CPU per operation over the same with its keys in-process, minus one.
    /// The median of each repeat's pair: the two ran one after the other,
    /// so the machine's drift between repeats stays out of the ratio (a
    /// ratio of the two medians can pair a fast repeat with a slow one).
    pub fn isolation_cost(&self, scenario: &str, case: &str) -> Option<f64> {
        let paired = self.paired_ratios(
            (scenario, case),
            (TargetKind::Tlsgate, TargetKind::TlsgateKeysInProcess),
            |c| c.server_cpu_us_per_op,
        );
        if !paired.is_empty() {
            return Some(median(paired) - 1.0);
        }
        let isolated = self.summary(scenario, case, TargetKind::Tlsgate)?;
        let inproc = self.summary(scenario, case, TargetKind::TlsgateKeysInProcess)?;
        excess(isolated.cpu_us_per_op, inproc.cpu_us_per_op)
    }

    /// Key isolation's cost at each load this run measured, against issue
    /// 19's bounds: 10 % with the server saturated, 15 % at `s_time`'s load.
    fn isolation_table(&self, out: &mut String) {
        let mut rows = Vec::new();
        for case in self.cases("handshake") {
            if let Some(c) = self.isolation_cost("handshake", &case) {
                rows.push((format!("{case}, saturated"), c, ISOLATION_SATURATED));
            }
        }
        for case in self.cases("latency") {
            if let Some(c) = self.isolation_cost("latency", &case) {
                rows.push((case, c, ISOLATION_IDLE));
            }
        }
        let cross = |t: TargetKind| {
            self.crosschecks
                .iter()
                .find(|c| c.target == t && c.case.starts_with("handshake"))
        };
        if let (Some(iso), Some(inproc)) = (
            cross(TargetKind::Tlsgate),
            cross(TargetKind::TlsgateKeysInProcess),
        ) {
            // Both measures of s_time's load, each round's pair (one 3 s
            // run of each moves by ±15 % here).
            if let Some(c) = iso.paired_ratio(inproc, true).map(|r| r - 1.0) {
                rows.push((format!("{}, `{}`", iso.case, iso.tool), c, ISOLATION_IDLE));
            }
            if let Some(c) = iso.paired_ratio(inproc, false).map(|r| r - 1.0) {
                let case = format!("{}, bench generator at s_time's rate", iso.case);
                rows.push((case, c, ISOLATION_IDLE));
            }
        }
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\n## Key isolation's cost\n\ntlsgate (private keys in a separate key process, the default) against tlsgate-inproc (`key_isolation = false`, keys in the worker), same run: server CPU per operation, isolated ÷ in-process − 1, the median of each repeat's pair. Issue 19's bounds: {:.0} % with the server saturated, {:.0} % where it is partly idle (a fixed rate, `openssl s_time`), where each signature's round trip wakes a sleeping process. Resumed handshakes sign nothing: their cost is the spread between two runs of the same work.\n\n| case | cost | bound | within |\n|---|---:|---:|---|",
            ISOLATION_SATURATED * 100.0,
            ISOLATION_IDLE * 100.0
        );
        for (case, cost, bound) in rows {
            let _ = writeln!(
                out,
                "| {case} | {:+.1} % | {:.0} % | {} |",
                cost * 100.0,
                bound * 100.0,
                // Within as shown: 10.0 % is within a 10 % bound.
                if (cost * 1000.0).round() <= bound * 1000.0 {
                    "yes"
                } else {
                    "**no**"
                }
            );
        }
    }

    fn latency_table(&self, out: &mut String, targets: &[TargetKind]) {
        for case in self.cases("latency") {
            let _ = writeln!(out, "\n## Handshake latency at a fixed rate: {case}\n");
            let _ = writeln!(out, "Open loop: arrivals do not wait for the server; latency counts from the scheduled start.\n");
            let _ = writeln!(out, "| target | achieved/s | p50 ms | p99 ms | max ms | server CPU % | failed |\n|---|---:|---:|---:|---:|---:|---:|");
            for t in targets {
                if let Some(s) = self.summary("latency", &case, *t) {
                    let _ = writeln!(
                        out,
                        "| {t} | {:.0} | {:.2} | {:.2} | {:.2} | {:.0} | {:.1} % |",
                        s.ops_per_sec,
                        s.p50_us / 1e3,
                        s.p99_us / 1e3,
                        self.cells
                            .iter()
                            .filter(|c| c.scenario == "latency" && c.case == case && c.target == *t)
                            .map(|c| c.load.latency.max_us)
                            .fold(0.0, f64::max)
                            / 1e3,
                        s.server_utilization * 100.0,
                        s.error_rate * 100.0
                    );
                }
            }
        }
    }

    fn h2_table(&self, out: &mut String) {
        if self.h2.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\n## HTTP/2 (h2load)\n\n`h2load -t 1` pinned to the generator's core drives each target over HTTP/2 (many streams per connection) and over HTTP/1.1 (`--h1`, one request in flight per connection). Server CPU over the whole run (warm-up included, prorated); medians of the repeats, which run every cell once each, interleaved. The last column is a target's h2 bytes per CPU-second ÷ its own HTTP/1.1 figure for the same file, the median of each repeat's pair (issue 17's goal for tlsgate at 1 MiB: at least 1; the peers' say what HTTP/2 costs them). Busy shares are the server's CPU ÷ the run's wall time and the generator core's share of the same time; ⚠ marks a row the generator limited (its core ≥ {:.0} % busy, the server < {:.0} %): such a row measures how fast the client takes each protocol in as much as what the server spends. The rows with an offered load send that many requests per second (`--rps`), the same for both protocols, below what the server answers at full speed: there CPU per byte compares at equal work (a row that fell short of its offered load says so).\n\n| target | case | protocol | req/s | server CPU µs/req | body MB per CPU-s | server busy | generator busy | h2 ÷ HTTP/1.1 bytes per CPU-s |\n|---|---|---|---:|---:|---:|---:|---:|---:|",
            CLIENT_SATURATED * 100.0,
            SERVER_BUSY * 100.0,
        );
        for r in &self.h2 {
            let mark = if r.generator_bound() { " ⚠" } else { "" };
            let short = if r.missed_offered_load() {
                " (offered load not reached)"
            } else {
                ""
            };
            let _ = writeln!(
                out,
                "| {} | {}{short} | {} | {:.0}{mark} | {:.1} | {:.0} | {:.0} % | {:.0} % | {} |",
                r.target,
                r.case,
                r.protocol,
                r.requests_per_sec,
                r.server_cpu_us_per_req,
                r.mb_per_cpu_sec,
                r.server_busy * 100.0,
                r.generator_busy * 100.0,
                r.per_repeat_ratio_to_http1
                    .map_or_else(String::new, |x| format!("{x:.2}"))
            );
        }
    }

    fn proxy_table(&self, out: &mut String, targets: &[TargetKind]) {
        let cases = self.cases(crate::proxy::SCENARIO);
        if cases.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\n## Proxy: TLS 1.3 in, keep-alive HTTP/1.1 to one plain-HTTP upstream\n\nThe proxy's CPU is its own process tree only; the upstream ({}) runs on the generator's core, its CPU per request and that core's busy share are shown beside. Ratios are the row's target ÷ nginx and ÷ HAProxy (lower is better). In the PROXY protocol cases the proxy begins each upstream connection with a v2 header naming the client, and such a connection serves that client connection only; nginx cannot send the header from its HTTP proxy and is not measured there. haproxy-relay is HAProxy in `mode tcp`, measured in the keep-alive cases: it terminates TLS and relays the bytes to the upstream on one connection per client connection without reading HTTP, so no proxy can do less for a request; its ratios are the floor of this machine's (the kernel's TCP work over loopback and TLS's records), which a proxy's ratios are to be read against.\n\n| case | target | req/s | proxy CPU µs/req | p50 ms | p99 ms | proxy CPU % | upstream CPU µs/req | generator core busy | CPU ÷ nginx | CPU ÷ HAProxy | p99 ÷ nginx | p99 ÷ HAProxy |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            self.versions.get("upstream").map_or("nginx", String::as_str)
        );
        let scenario = crate::proxy::SCENARIO;
        let vs = |s: &Summary, other: TargetKind, f: fn(&Summary) -> f64| match self
            .summary(scenario, &s.case, other)
        {
            Some(o) if f(o) > 0.0 => format!("{:.2}", f(s) / f(o)),
            _ => "–".into(),
        };
        for case in &cases {
            for t in targets {
                let Some(s) = self.summary(scenario, case, *t) else {
                    continue;
                };
                let warn = if s.generator_bound { " ⚠" } else { "" };
                let _ = writeln!(
                    out,
                    "| {case} | {t} | {:.0}{warn} | {:.1} | {:.2} | {:.2} | {:.0} | {:.1} | {:.0} % | {} | {} | {} | {} |",
                    s.ops_per_sec,
                    s.cpu_us_per_op,
                    s.p50_us / 1e3,
                    s.p99_us / 1e3,
                    s.server_utilization * 100.0,
                    s.beside_cpu_us_per_op,
                    s.client_core_busy * 100.0,
                    vs(s, TargetKind::Nginx, |s| s.cpu_us_per_op),
                    vs(s, TargetKind::Haproxy, |s| s.cpu_us_per_op),
                    vs(s, TargetKind::Nginx, |s| s.p99_us),
                    vs(s, TargetKind::Haproxy, |s| s.p99_us),
                );
            }
        }
    }

    fn transfer_table(&self, out: &mut String, targets: &[TargetKind]) {
        let cases = self.cases("transfer");
        if cases.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\n## Transfer: keep-alive GETs over many connections\n"
        );
        let _ = write!(out, "| size |");
        for t in targets {
            let _ = write!(out, " {t} req/s | {t} MB/s | {t} MB per CPU-s |");
        }
        let _ = writeln!(out, " tlsgate÷nginx bytes/CPU-s |");
        let _ = write!(out, "|---|");
        for _ in targets {
            let _ = write!(out, "---:|---:|---:|");
        }
        let _ = writeln!(out, "---:|");
        for case in &cases {
            let _ = write!(out, "| {case} |");
            for t in targets {
                match self.summary("transfer", case, *t) {
                    Some(s) => {
                        let warn = if s.generator_bound { " ⚠" } else { "" };
                        let _ = write!(
                            out,
                            " {:.0}{warn} | {:.1} | {:.1} |",
                            s.ops_per_sec,
                            s.bytes_per_sec / 1e6,
                            s.bytes_per_cpu_sec / 1e6
                        );
                    }
                    None => {
                        let _ = write!(out, " – | – | – |");
                    }
                }
            }
            let _ = writeln!(
                out,
                " {} |",
                self.paired_ratio_to_nginx(
                    "transfer",
                    case,
                    |c| ratio(c.load.bytes as f64, c.server_cpu_secs),
                    |s| s.bytes_per_cpu_sec
                )
            );
        }
    }

    fn idle_table(&self, out: &mut String, targets: &[TargetKind]) {
        let cases = self.cases(crate::scenario::IDLE);
        if cases.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\n## Idle: keep-alive connections after one 1 KiB GET each\n\n\
             Server PSS with every connection open and waiting, and what it grew by per \
             connection from before the first one opened. HAProxy takes two descriptors per \
             connection and is held to {} connections here.\n",
            crate::targets::connection_ceiling()
        );
        let _ = write!(out, "| connections |");
        for t in targets {
            let _ = write!(out, " {t} open | {t} PSS MB | {t} KiB/conn |");
        }
        let _ = writeln!(out, " tlsgate ÷ nginx PSS |");
        let _ = write!(out, "|---|");
        for _ in targets {
            let _ = write!(out, "---:|---:|---:|");
        }
        let _ = writeln!(out, "---:|");
        for case in &cases {
            let _ = write!(out, "| {case} |");
            for t in targets {
                match self.summary(crate::scenario::IDLE, case, *t) {
                    Some(s) => {
                        let _ = write!(
                            out,
                            " {:.0} | {:.1} | {:.1} |",
                            s.connections_open,
                            s.pss_bytes / 1e6,
                            s.pss_per_connection / 1024.0,
                        );
                    }
                    None => {
                        let _ = write!(out, " – | – | – |");
                    }
                }
            }
            let _ = writeln!(
                out,
                " {} |",
                self.ratio_to_nginx(crate::scenario::IDLE, case, |s| s.pss_bytes)
            );
        }
    }

    fn stream_table(&self, out: &mut String, targets: &[TargetKind]) {
        let cases = self.cases("stream");
        if cases.is_empty() {
            return;
        }
        let _ = writeln!(
            out,
            "\n## Stream: connections each fetching 1 MiB every 1–5 s\n"
        );
        let _ = write!(out, "| connections |");
        for t in targets {
            let _ = write!(
                out,
                " {t} MB/s | {t} CPU % | {t} PSS MB | {t} KiB/conn | {t} late/s |"
            );
        }
        let _ = writeln!(out);
        let _ = write!(out, "|---|");
        for _ in targets {
            let _ = write!(out, "---:|---:|---:|---:|---:|");
        }
        let _ = writeln!(out);
        for case in &cases {
            let _ = write!(out, "| {case} |");
            for t in targets {
                match self.summary("stream", case, *t) {
                    Some(s) => {
                        let warn = if s.generator_bound { " ⚠" } else { "" };
                        let _ = write!(
                            out,
                            " {:.1}{warn} | {:.0} | {:.1} | {:.1} | {:.1} |",
                            s.bytes_per_sec / 1e6,
                            s.server_utilization * 100.0,
                            s.pss_bytes / 1e6,
                            s.pss_per_connection / 1024.0,
                            s.late_per_sec
                        );
                    }
                    None => {
                        let _ = write!(out, " – | – | – | – | – |");
                    }
                }
            }
            let _ = writeln!(out);
        }
    }
}

impl Results {
    /// What is not sane: a cell with no operations, no server CPU or no
    /// bytes; a target missing from a scenario. Empty when all is well.
    pub fn insanities(&self) -> Vec<String> {
        let mut out = Vec::new();
        for c in &self.cells {
            let what = format!("{} {} on {}", c.scenario, c.case, c.target);
            if c.scenario == crate::scenario::IDLE {
                // No request in the window, by design: every connection
                // must have made its one GET and still be open. (PSS need
                // not grow: a few hundred connections fit in what an
                // earlier point's allocations left free.)
                let (open, idle) = (extra(c, "connections_open"), extra(c, "idle_at_window"));
                if open <= 0.0 || idle < open * 0.99 || c.pss_open == 0 {
                    out.push(format!(
                        "{what}: {idle} of {open} connections idle after their GET, PSS {}",
                        c.pss_open
                    ));
                }
                continue;
            }
            if c.load.operations == 0 {
                out.push(format!("{what}: no operation completed"));
            }
            if c.server_cpu_secs <= 0.0 {
                out.push(format!("{what}: no server CPU time measured"));
            }
            if c.load.bytes == 0 {
                out.push(format!("{what}: no bytes received"));
            }
            if c.load.client_cpu_secs <= 0.0 {
                out.push(format!("{what}: no generator CPU time measured"));
            }
            if c.scenario == "handshake" && c.load.handshakes == 0 {
                out.push(format!("{what}: no handshake completed"));
            }
            // A proxy that answers errors (502, 504) measures its error
            // path: more than 1 % failed requests void the cell.
            if c.scenario == crate::proxy::SCENARIO {
                if c.load.error_count() * 100 > c.load.operations {
                    out.push(format!(
                        "{what}: {} failed requests of {} ({:?})",
                        c.load.error_count(),
                        c.load.operations,
                        c.load.first_error
                    ));
                }
                if extra(c, "beside_cpu_us_per_op") <= 0.0 {
                    out.push(format!("{what}: no upstream CPU time measured"));
                }
            }
        }
        let targets = self.targets();
        for scenario in [
            "handshake",
            "latency",
            "transfer",
            "stream",
            crate::scenario::IDLE,
            "proxy",
        ] {
            // tlsgate-inproc runs beside tlsgate in the handshake
            // scenarios, elsewhere only as a target of its own.
            let here = self.targets_in(scenario);
            let beside_tlsgate =
                matches!(scenario, "handshake" | "latency") && here.contains(&TargetKind::Tlsgate);
            let expected: Vec<TargetKind> = targets
                .iter()
                .copied()
                .filter(|t| match t {
                    TargetKind::TlsgateKeysInProcess => beside_tlsgate || here.contains(t),
                    // The TLS relay runs in the proxy scenario only.
                    TargetKind::HaproxyRelay => scenario == crate::proxy::SCENARIO,
                    _ => true,
                })
                .collect();
            for case in self.cases(scenario) {
                for t in &expected {
                    if scenario == crate::proxy::SCENARIO && !crate::proxy::measures(&case, *t) {
                        continue;
                    }
                    if self.summary(scenario, &case, *t).is_none() {
                        out.push(format!("{scenario} {case}: {t} was not measured"));
                    }
                }
            }
        }
        for r in &self.h2 {
            // Requests in flight when h2load's time is up count as failed:
            // more than 1 % is a problem.
            if r.requests_per_sec <= 0.0
                || r.server_cpu_us_per_req <= 0.0
                || r.failed * 100 > r.requests
            {
                out.push(format!(
                    "h2 {} on {} ({}): {} failed, {:.0} req/s, {:.1} µs/req",
                    r.case,
                    r.target,
                    r.protocol,
                    r.failed,
                    r.requests_per_sec,
                    r.server_cpu_us_per_req
                ));
            }
        }
        for c in &self.crosschecks {
            if c.operations == 0 || c.server_cpu_us_per_op <= 0.0 || c.bench_cpu_us_per_op <= 0.0 {
                out.push(format!(
                    "cross-check {} ({}) on {}: nothing measured",
                    c.tool, c.case, c.target
                ));
            }
        }
        if let Some(b) = &self.bounds {
            if b.ops_ns.values().any(|v| *v <= 0.0) {
                out.push("bound: an operation measured zero".into());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(vec![]), 0.0);
    }

    fn cell(target: TargetKind, ops: u64, cpu_ns: u64, client_cpu: f64) -> Cell {
        let load = Report {
            window_secs: 1.0,
            operations: ops,
            handshakes: ops,
            bytes: ops * 1000,
            client_cpu_secs: client_cpu,
            client_threads: 1,
            ..Report::default()
        };
        Cell::new(
            "handshake",
            "TLS1.3 ECDSA full",
            target,
            0,
            load,
            cpu_ns,
            0,
            0,
            0,
        )
    }

    #[test]
    fn cells_derive_cpu_per_op_and_flag_a_saturated_generator() {
        let c = cell(TargetKind::Tlsgate, 1000, 500_000_000, 0.99);
        assert!((c.server_cpu_us_per_op - 500.0).abs() < 1e-9);
        assert!((c.server_cpu_ns_per_byte - 500.0).abs() < 1e-9);
        assert!(c.generator_bound, "client 99 % busy, server 50 %");
        assert!(!cell(TargetKind::Tlsgate, 1000, 990_000_000, 0.99).generator_bound);
    }

    fn proxy_cell(target: TargetKind, errors: u64, upstream_us: f64, core_busy: f64) -> Cell {
        let mut load = Report {
            window_secs: 1.0,
            operations: 1000,
            bytes: 1_000_000,
            client_cpu_secs: 0.5,
            client_threads: 1,
            ..Report::default()
        };
        if errors > 0 {
            load.errors.insert("status".into(), errors);
        }
        load.extra
            .insert("beside_cpu_us_per_op".into(), upstream_us);
        load.extra.insert("client_core_busy".into(), core_busy);
        Cell::new(
            crate::proxy::SCENARIO,
            "1 KiB keep-alive",
            target,
            0,
            load,
            20_000_000,
            0,
            0,
            0,
        )
    }

    #[test]
    fn proxy_rows_show_both_ratios_and_broken_cells_are_not_sane() {
        let mut r = Results::new(Machine::detect("test".into()), true);
        r.versions.insert("upstream".into(), "nginx/1.22.1".into());
        r.cells.push(proxy_cell(TargetKind::Tlsgate, 0, 10.0, 0.5));
        r.cells.push(proxy_cell(TargetKind::Nginx, 0, 11.0, 0.5));
        let mut haproxy = proxy_cell(TargetKind::Haproxy, 0, 12.0, 0.5);
        haproxy.server_cpu_us_per_op = 40.0;
        r.cells.push(haproxy);
        r.summarize();
        let md = r.markdown();
        assert!(md.contains("## Proxy: TLS 1.3 in"), "{md}");
        // 20 µs against nginx's 20 and HAProxy's 40; upstream 10 µs; 50 %.
        assert!(
            md.contains("| 1 KiB keep-alive | tlsgate | 1000 | 20.0 |")
                && md.contains("| 10.0 | 50 % | 1.00 | 0.50 |"),
            "{md}"
        );
        assert!(r.insanities().is_empty(), "{:?}", r.insanities());

        // More than 1 % failed requests, or no upstream CPU: not a figure.
        r.cells.push(proxy_cell(TargetKind::Tlsgate, 11, 10.0, 0.5));
        r.cells.push(proxy_cell(TargetKind::Nginx, 0, 0.0, 0.5));
        let insane = r.insanities();
        assert!(
            insane.iter().any(|i| i.contains("11 failed requests")),
            "{insane:?}"
        );
        assert!(
            insane.iter().any(|i| i.contains("no upstream CPU time")),
            "{insane:?}"
        );
    }

    /// tlsgate ÷ nginx pairs the cells of each repeat: here the medians
    /// (300 and 400 µs) would give 0.75, the repeats' pairs 0.5, 0.75 and
    /// 0.5.
    #[test]
    fn ratio_to_nginx_is_the_median_of_each_repeats_pair() {
        let mut r = Results::new(Machine::detect("test".into()), true);
        for (repeat, t, n) in [(0, 200, 400), (1, 300, 400), (2, 400, 800)] {
            let mut a = cell(TargetKind::Tlsgate, 1000, t * 1_000_000, 0.5);
            let mut b = cell(TargetKind::Nginx, 1000, n * 1_000_000, 0.5);
            (a.repeat, b.repeat) = (repeat, repeat);
            r.cells.extend([a, b]);
        }
        r.summarize();
        let md = r.markdown();
        assert!(md.contains("| 0.50 | – | – |"), "{md}");
    }

    #[test]
    fn the_report_names_tcps_congestion_control_and_warns_of_bbrs_pacing() {
        let mut r = Results::new(Machine::detect("test".into()), true);
        r.machine.tcp = "congestion control bbr, default qdisc pfifo_fast".into();
        let md = r.markdown();
        assert!(
            md.contains("TCP: congestion control bbr, default qdisc pfifo_fast."),
            "{md}"
        );
        assert!(md.contains("⚠ BBR paces"), "{md}");
        r.machine.tcp = "congestion control cubic, default qdisc fq".into();
        assert!(!r.markdown().contains("⚠ BBR"));
        // Results written before the field existed still read.
        let mut old = serde_json::to_value(&r.machine).unwrap();
        old.as_object_mut().unwrap().remove("tcp");
        let m: Machine = serde_json::from_value(old).unwrap();
        assert_eq!(m.tcp, "");
        assert!(Machine::detect("x".into())
            .tcp
            .starts_with("congestion control "));
    }

    #[test]
    fn report_shows_ratio_to_nginx() {
        let mut r = Results::new(Machine::detect("test".into()), true);
        r.cells
            .push(cell(TargetKind::Tlsgate, 1000, 300_000_000, 0.5));
        r.cells
            .push(cell(TargetKind::Nginx, 1000, 600_000_000, 0.5));
        r.summarize();
        assert_eq!(r.summaries.len(), 2);
        let md = r.markdown();
        assert!(md.contains("| TLS1.3 ECDSA full | 1000 | 300 |"), "{md}");
        assert!(md.contains("| 0.50 |"), "{md}");
    }

    /// tlsgate beside tlsgate-inproc: the handshake table and the isolation
    /// section give the cost, and say when it is over the bound.
    #[test]
    fn isolation_cost_is_reported_against_its_bounds() {
        let mut r = Results::new(Machine::detect("test".into()), true);
        r.cells
            .push(cell(TargetKind::Tlsgate, 1000, 330_000_000, 0.5));
        r.cells.push(cell(
            TargetKind::TlsgateKeysInProcess,
            1000,
            300_000_000,
            0.5,
        ));
        r.cells
            .push(cell(TargetKind::Nginx, 1000, 600_000_000, 0.5));
        r.summarize();
        let cost = r.isolation_cost("handshake", "TLS1.3 ECDSA full").unwrap();
        assert!((cost - 0.10).abs() < 1e-9, "{cost}");
        let md = r.markdown();
        assert!(md.contains("| 0.55 | +10 % |"), "{md}");
        assert!(
            md.contains("| TLS1.3 ECDSA full, saturated | +10.0 % | 10 % | yes |"),
            "{md}"
        );
        r.cells[0] = cell(TargetKind::Tlsgate, 1000, 345_000_000, 0.5);
        r.summarize();
        let md = r.markdown();
        assert!(md.contains("| +15.0 % | 10 % | **no** |"), "{md}");
        assert!(r.isolation_cost("handshake", "no such case").is_none());
    }

    /// The cost pairs each repeat's two cells: a repeat on a slow machine
    /// moves both, not the ratio.
    #[test]
    fn isolation_cost_is_the_median_of_each_repeats_pair() {
        let mut r = Results::new(Machine::detect("test".into()), true);
        // Per repeat (isolated, in-process) µs: +10 %, +10 %, +20 %, the
        // third on a machine twice as slow.
        for (repeat, iso, inproc) in [(0, 110, 100), (1, 220, 200), (2, 120, 100)] {
            for (target, cpu_us) in [
                (TargetKind::Tlsgate, iso),
                (TargetKind::TlsgateKeysInProcess, inproc),
            ] {
                let mut c = cell(target, 1000, cpu_us * 1_000_000, 0.5);
                c.repeat = repeat;
                r.cells.push(c);
            }
        }
        r.summarize();
        let cost = r.isolation_cost("handshake", "TLS1.3 ECDSA full").unwrap();
        // The ratio of the medians (120 ÷ 100) would say +20 %.
        assert!((cost - 0.10).abs() < 1e-9, "{cost}");
    }

    /// tlsgate-inproc is expected where it ran (the handshake cells), and
    /// in each of their cases.
    #[test]
    fn inproc_is_required_only_in_the_scenarios_it_ran() {
        let mut r = Results::new(Machine::detect("test".into()), true);
        let mut transfer = cell(TargetKind::Tlsgate, 1000, 300_000_000, 0.5);
        transfer.scenario = "transfer".into();
        transfer.case = "1k".into();
        let mut second = cell(TargetKind::Tlsgate, 1000, 300_000_000, 0.5);
        second.case = "TLS1.3 ECDSA resumed".into();
        r.cells = vec![
            cell(TargetKind::Tlsgate, 1000, 330_000_000, 0.5),
            cell(TargetKind::TlsgateKeysInProcess, 1000, 300_000_000, 0.5),
            transfer,
        ];
        r.summarize();
        let missing = |r: &Results| -> Vec<String> {
            r.insanities()
                .into_iter()
                .filter(|p| p.contains("not measured"))
                .collect()
        };
        assert_eq!(missing(&r), Vec::<String>::new());
        r.cells.push(second);
        r.summarize();
        assert_eq!(
            missing(&r),
            ["handshake TLS1.3 ECDSA resumed: tlsgate-inproc was not measured"]
        );
        // Nothing of tlsgate-inproc in the handshake cells at all, though
        // it ran elsewhere: missing too. And no table shows a target
        // that its scenario did not measure.
        r.cells
            .retain(|c| c.target != TargetKind::TlsgateKeysInProcess);
        let mut idle = cell(TargetKind::TlsgateKeysInProcess, 1000, 300_000_000, 0.5);
        idle.scenario = "transfer".into();
        idle.case = "1k".into();
        r.cells.push(idle);
        r.summarize();
        assert_eq!(missing(&r).len(), 2, "{:?}", missing(&r));
        assert_eq!(r.targets_in("handshake"), [TargetKind::Tlsgate]);
        assert!(!r.markdown().contains("tlsgate-inproc CPU µs/hs"));
    }

    fn crosscheck(target: TargetKind, tool_us: f64, bench_us: f64) -> CrossCheck {
        CrossCheck {
            target,
            case: "handshake TLS1.3 ECDSA full".into(),
            tool: "openssl s_time".into(),
            operations: 1000,
            secs: 1.0,
            server_cpu_us_per_op: tool_us,
            bench_cpu_us_per_op: bench_us,
            bench_load: String::new(),
            bench_saturated_cpu_us_per_op: 0.0,
            tool_generator_busy: 1.0,
            bench_generator_busy: 1.0,
            bench_ops_per_sec: 1000.0,
            rounds: Vec::new(),
        }
    }

    /// The tools' tlsgate ÷ nginx against the bench's at the same load, and
    /// isolation's cost at s_time's load.
    #[test]
    fn cross_checks_say_whether_tool_and_bench_agree() {
        let mut r = Results::new(Machine::detect("test".into()), true);
        r.crosschecks = vec![
            crosscheck(TargetKind::Tlsgate, 600.0, 660.0),
            crosscheck(TargetKind::TlsgateKeysInProcess, 500.0, 550.0),
            crosscheck(TargetKind::Nginx, 1000.0, 1000.0),
        ];
        let md = r.markdown();
        assert!(md.contains("| 0.60 | 0.66 | 0.91 | yes |"), "{md}");
        assert!(
            md.contains("`openssl s_time` | +20.0 % | 15 % | **no** |"),
            "{md}"
        );
        assert!(
            md.contains("at s_time's rate | +20.0 % | 15 % | **no** |"),
            "{md}"
        );
        r.crosschecks[0].server_cpu_us_per_op = 400.0;
        let md = r.markdown();
        assert!(md.contains("| 0.40 | 0.66 | 0.61 | **no** |"), "{md}");
    }
}
