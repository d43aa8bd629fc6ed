//! `tlsgate bench`: arguments in, report out. The work is in tlsgate-bench.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tlsgate_bench::{plot, scenario, BenchOptions, Placement, Scenario, TargetKind};

/// Arguments of `tlsgate bench`.
#[derive(clap::Args)]
pub struct BenchArgs {
    /// handshake, transfer, stream, bound, crosscheck, h2, proxy or all; or synflood
    /// (legitimate handshakes under a spoofed SYN flood, kernel alone and
    /// with XDP SynGate; needs root, not part of all); or report (writes
    /// --out DIR's report.md and plots again from its results.json).
    scenario: String,
    /// A smoke run of seconds (CI): checks that every figure is sane, not fast.
    #[arg(long)]
    quick: bool,
    /// Targets, comma-separated: tlsgate,nginx,haproxy, and tlsgate-inproc
    /// (tlsgate with its keys in the worker, `key_isolation = false`; the
    /// handshake and crosscheck scenarios add it beside tlsgate unless
    /// --no-isolation-cost).
    #[arg(long, value_delimiter = ',', default_value = "tlsgate,nginx,haproxy")]
    targets: Vec<String>,
    /// Where results.json, report.md and the plots go
    /// (default: bench-results/<UTC date-time>).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Repeats of every cell, and rounds of the cross-check; medians are
    /// reported. Default 3 (the cross-check 5; 1 and 1 with --quick).
    #[arg(long)]
    repeats: Option<usize>,
    /// Measurement window of every cell, seconds.
    #[arg(long, value_name = "SECS")]
    measure: Option<f64>,
    /// The core every server runs on.
    #[arg(long)]
    server_core: Option<usize>,
    /// Generator cores, comma-separated (one thread each).
    #[arg(long, value_delimiter = ',')]
    client_cores: Vec<usize>,
    /// Stream scenario connection counts, comma-separated; 0 for none
    /// (the idle points only).
    #[arg(long, value_delimiter = ',')]
    stream_connections: Vec<usize>,
    /// Stream scenario idle connection counts (keep-alive connections
    /// after one 1 KiB GET each, measured for memory), comma-separated;
    /// 0 for none.
    #[arg(long, value_delimiter = ',')]
    idle_connections: Vec<usize>,
    /// Leave tlsgate-inproc out of the handshake and crosscheck scenarios
    /// (key isolation's cost is then not measured).
    #[arg(long)]
    no_isolation_cost: bool,
    /// Transfer scenario file sizes, comma-separated (e.g. 16k,1m,10m).
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<String>,
    /// tlsgate's kernel-TLS policy: auto, always or never (kTLS kernels only).
    #[arg(long, value_name = "POLICY", default_value = "auto")]
    offload: String,
    /// synflood: how the generator sends the flood, xdp (xdp_frames from
    /// BPF_PROG_RUN live frames, as a NIC driver hands frames to the
    /// host) or packet (AF_PACKET skbs, which veth copies before XDP).
    #[arg(long, value_name = "HOW", default_value = "xdp")]
    flood_inject: String,
    /// synflood: flood rates in SYN/s, comma-separated, `max` for the
    /// generator's maximum (default 0,25000,50000,100000,200000,400000,800000,max; the
    /// first should be 0: the per-SYN CPU is counted above it).
    #[arg(long, value_delimiter = ',', value_name = "RATES")]
    flood_rates: Vec<String>,
}

/// Runs the bench; exit 0 when every figure is sane, 1 otherwise, 2 on usage errors.
pub fn run(args: BenchArgs) -> ExitCode {
    if args.scenario == "synflood" {
        return synflood(&args);
    }
    if args.scenario == "report" {
        return rerender(args.out.as_deref());
    }
    let Some(scenarios) = Scenario::parse(&args.scenario) else {
        eprintln!(
            "tlsgate: error: unknown scenario {:?}: expected handshake, transfer, stream, bound, crosscheck, h2, proxy or all",
            args.scenario
        );
        return ExitCode::from(2);
    };
    let mut targets = Vec::new();
    for t in &args.targets {
        match TargetKind::parse(t) {
            Some(k) => targets.push(k),
            None => {
                eprintln!("tlsgate: error: --targets: unknown target {t:?}: expected tlsgate, tlsgate-inproc, nginx or haproxy");
                return ExitCode::from(2);
            }
        }
    }
    let bin = match std::env::current_exe() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("tlsgate: error: cannot find my own binary: {e}");
            return ExitCode::from(1);
        }
    };
    let mut opts = BenchOptions::new(args.quick, bin);
    opts.targets = targets;
    opts.isolation_cost = !args.no_isolation_cost;
    if let Some(r) = args.repeats {
        opts.repeats = r.max(1);
        opts.crosscheck_rounds = r.max(1);
    }
    if let Some(m) = args.measure {
        if m.is_nan() || m <= 0.0 {
            eprintln!("tlsgate: error: --measure must be positive");
            return ExitCode::from(2);
        }
        opts.measure = Duration::from_secs_f64(m);
    }
    if args.server_core.is_some() || !args.client_cores.is_empty() {
        let detected = Placement::detect();
        opts.placement = Placement {
            server_core: args.server_core.or(detected.server_core),
            client_cores: if args.client_cores.is_empty() {
                detected.client_cores
            } else {
                args.client_cores.iter().map(|c| Some(*c)).collect()
            },
        };
    }
    if !args.stream_connections.is_empty() {
        opts.stream_connections = args
            .stream_connections
            .iter()
            .copied()
            .filter(|c| *c > 0)
            .collect();
    }
    if !args.idle_connections.is_empty() {
        opts.idle_connections = args
            .idle_connections
            .iter()
            .copied()
            .filter(|c| *c > 0)
            .collect();
    }
    if !args.sizes.is_empty() {
        let mut sizes = Vec::new();
        for t in &args.sizes {
            match tlsgate_bench::materials::parse_size(t) {
                Some(n) if n > 0 => sizes.push(n),
                _ => {
                    eprintln!(
                        "tlsgate: error: --sizes: {t:?} is not a size: expected e.g. 16k, 1m, 4096"
                    );
                    return ExitCode::from(2);
                }
            }
        }
        opts.sizes = sizes;
    }
    opts.tlsgate_offload = match args.offload.as_str() {
        "auto" => tlsgate_config::OffloadPolicy::Auto,
        "always" => tlsgate_config::OffloadPolicy::Always,
        "never" => tlsgate_config::OffloadPolicy::Never,
        other => {
            eprintln!("tlsgate: error: --offload: unknown policy {other:?}: expected auto, always or never");
            return ExitCode::from(2);
        }
    };
    let out = args.out.unwrap_or_else(|| {
        let stamp = time::OffsetDateTime::now_utc()
            .format(time::macros::format_description!(
                "[year][month][day]T[hour][minute][second]Z"
            ))
            .unwrap_or_else(|_| "latest".into());
        PathBuf::from("bench-results").join(stamp)
    });
    let results = match scenario::run(&scenarios, &opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tlsgate: bench failed: {e}");
            return ExitCode::from(1);
        }
    };
    if let Err(e) = results.write(&out) {
        eprintln!("tlsgate: error: {e}");
        return ExitCode::from(1);
    }
    let plots = match plot::write_all(&results, &out) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("tlsgate: error: {e}");
            return ExitCode::from(1);
        }
    };
    println!("{}", results.markdown());
    println!("results: {}", out.join("results.json").display());
    println!("report:  {}", out.join("report.md").display());
    for p in plots {
        println!("plot:    {}", p.display());
    }
    let insane = results.insanities();
    if insane.is_empty() {
        ExitCode::SUCCESS
    } else {
        for i in insane {
            eprintln!("tlsgate: bench: not sane: {i}");
        }
        ExitCode::from(1)
    }
}

/// `tlsgate bench synflood`: the table on stdout, synflood.json and
/// synflood.md in the output directory.
fn synflood(args: &BenchArgs) -> ExitCode {
    use tlsgate_bench::synflood::{markdown, plot, run, SynfloodOptions};
    let bin = match std::env::current_exe() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("tlsgate: error: cannot find my own binary: {e}");
            return ExitCode::from(1);
        }
    };
    let mut o = SynfloodOptions::new(bin, args.quick);
    if let Some(m) = args.measure {
        if m.is_nan() || m <= 0.0 {
            eprintln!("tlsgate: error: --measure must be positive");
            return ExitCode::from(2);
        }
        o.window.measure = Duration::from_secs_f64(m);
    }
    if let Some(c) = args.server_core {
        o.server_core = c;
    }
    o.inject = match args.flood_inject.as_str() {
        "packet" => tlsgate_loadgen::synflood::Inject::Packet,
        "xdp" => tlsgate_loadgen::synflood::Inject::XdpLive,
        other => {
            eprintln!("tlsgate: error: --flood-inject must be packet or xdp, not {other:?}");
            return ExitCode::from(2);
        }
    };
    if let Some(c) = args.client_cores.first() {
        o.client_core = *c;
    }
    if !args.flood_rates.is_empty() {
        let mut rates = Vec::new();
        for r in &args.flood_rates {
            match r.as_str() {
                "max" => rates.push(None),
                n => {
                    match n.parse::<u64>() {
                        Ok(v) => rates.push(Some(v)),
                        Err(_) => {
                            eprintln!("tlsgate: error: --flood-rates: {n:?} is not a rate in SYN/s or max");
                            return ExitCode::from(2);
                        }
                    }
                }
            }
        }
        o.rates = rates;
    }
    let out = args.out.clone().unwrap_or_else(|| {
        let stamp = time::OffsetDateTime::now_utc()
            .format(time::macros::format_description!(
                "[year][month][day]T[hour][minute][second]Z"
            ))
            .unwrap_or_else(|_| "latest".into());
        PathBuf::from("bench-results").join(stamp)
    });
    let cells = match run(&o) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tlsgate: bench synflood failed: {e}");
            return ExitCode::from(1);
        }
    };
    let table = markdown(&cells);
    let written = std::fs::create_dir_all(&out)
        .and_then(|()| {
            std::fs::write(
                out.join("synflood.json"),
                serde_json::to_string_pretty(&cells).unwrap_or_default(),
            )
        })
        .and_then(|()| std::fs::write(out.join("synflood.md"), &table));
    if let Err(e) = written {
        eprintln!("tlsgate: error: {}: {e}", out.display());
        return ExitCode::from(1);
    }
    let svg = out.join("synflood.svg");
    if let Err(e) = plot(&cells, &svg) {
        eprintln!("tlsgate: error: {e}");
        return ExitCode::from(1);
    }
    println!("{table}");
    println!("results: {}", out.join("synflood.json").display());
    println!("plot:    {}", svg.display());
    let failed: Vec<_> = cells
        .iter()
        .filter(|c| c.handshakes_per_sec <= 0.0)
        .collect();
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "tlsgate: bench synflood: no handshake completed in {} cell(s)",
            failed.len()
        );
        ExitCode::from(1)
    }
}

/// `tlsgate bench report --out DIR`: the report and plots of an earlier
/// run, written again from its `results.json` by this build's report code
/// (nothing is measured).
fn rerender(dir: Option<&std::path::Path>) -> ExitCode {
    let Some(dir) = dir else {
        eprintln!(
            "tlsgate: error: bench report needs --out DIR, the directory holding results.json"
        );
        return ExitCode::from(2);
    };
    let path = dir.join("results.json");
    let text = match std::fs::read_to_string(&path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("tlsgate: error: {}: {e}", path.display());
            return ExitCode::from(2);
        }
    };
    let results: tlsgate_bench::Results = match serde_json::from_str(&text) {
        Ok(r) => r,
        Err(e) => {
            eprintln!(
                "tlsgate: error: {}: not a bench results file: {e}",
                path.display()
            );
            return ExitCode::from(2);
        }
    };
    if let Err(e) = results.write(dir) {
        eprintln!("tlsgate: error: {e}");
        return ExitCode::from(1);
    }
    match plot::write_all(&results, dir) {
        Ok(plots) => {
            println!("report:  {}", dir.join("report.md").display());
            for p in plots {
                println!("plot:    {}", p.display());
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tlsgate: error: {e}");
            ExitCode::from(1)
        }
    }
}
