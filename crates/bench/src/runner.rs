//! Runs one load job against one target and turns the generator's report
//! and the server's /proc samples, taken at the window's edges, into a
//! [`Cell`].

use std::sync::Mutex;

use tlsgate_loadgen::{
    run_handshakes, run_stream, run_transfer, HandshakeJob, Observer, Report, StreamJob,
    TlsProfile, TransferJob, Version,
};

use crate::error::BenchError;
use crate::proc::{CoreTicks, ProcessTree, Sample};
use crate::report::{generator_limited, Cell};
use crate::targets::Target;

/// Which cores the server and the generator use.
#[derive(Debug, Clone)]
pub struct Placement {
    /// The server's core (every target runs there).
    pub server_core: Option<usize>,
    /// One generator thread per entry.
    pub client_cores: Vec<Option<usize>>,
}

impl Placement {
    /// Server on core 0, generator on every other core; unpinned on one core.
    pub fn detect() -> Self {
        let cores = core_affinity::get_core_ids().map_or(1, |c| c.len());
        if cores >= 2 {
            Self {
                server_core: Some(0),
                client_cores: (1..cores).map(Some).collect(),
            }
        } else {
            Self {
                server_core: None,
                client_cores: vec![None],
            }
        }
    }
}

/// A job of any scenario.
pub enum Job {
    /// Connection per request.
    Handshake(HandshakeJob),
    /// Keep-alive transfers.
    Transfer(TransferJob),
    /// Streaming.
    Stream(StreamJob),
}

impl Job {
    fn profile(&self) -> &TlsProfile {
        match self {
            Job::Handshake(j) => &j.profile,
            Job::Transfer(j) => &j.profile,
            Job::Stream(j) => &j.profile,
        }
    }
}

/// A process that serves the target during a cell without being the
/// target (the `proxy` scenario's upstream), measured over the same window.
pub struct Beside<'a> {
    /// Its processes.
    pub tree: &'a ProcessTree,
    /// The generator's core, whose busy share is measured too (it may
    /// share the core with the generator).
    pub client_core: Option<usize>,
}

/// What is sampled at one edge of the window.
#[derive(Default)]
struct Edge {
    target: Sample,
    beside_cpu_ns: u64,
    core: Option<CoreTicks>,
}

/// Samples the server's process tree (and whatever runs beside it) when
/// the window opens and closes.
struct Sampler<'a> {
    tree: &'a ProcessTree,
    beside: Option<&'a Beside<'a>>,
    open: Mutex<Option<Edge>>,
    close: Mutex<Option<Edge>>,
}

impl Sampler<'_> {
    fn edge(&self) -> Edge {
        Edge {
            target: self.tree.sample(),
            beside_cpu_ns: self.beside.map_or(0, |b| b.tree.cpu_ns()),
            core: self
                .beside
                .and_then(|b| b.client_core)
                .and_then(CoreTicks::now),
        }
    }
}

impl Observer for Sampler<'_> {
    fn window_opened(&self) {
        let e = self.edge();
        if let Ok(mut o) = self.open.lock() {
            *o = Some(e);
        }
    }
    fn window_closed(&self) {
        let e = self.edge();
        if let Ok(mut c) = self.close.lock() {
            *c = Some(e);
        }
    }
}

/// Runs the job against the target.
pub struct Runner;

impl Runner {
    /// Measures one cell.
    pub fn measure(
        target: &mut Target,
        scenario: &str,
        case: &str,
        repeat: usize,
        job: Job,
    ) -> Result<Cell, BenchError> {
        Self::measure_beside(target, None, scenario, case, repeat, job)
    }

    /// Measures one cell, and what runs beside the target over the same
    /// window: its CPU per operation goes into the report's `extra` as
    /// `beside_cpu_us_per_op` and `beside_utilization`, the generator
    /// core's busy share as `client_core_busy`; a cell whose generator
    /// core was saturated while the server was not is generator-bound.
    pub fn measure_beside(
        target: &mut Target,
        beside: Option<&Beside<'_>>,
        scenario: &str,
        case: &str,
        repeat: usize,
        job: Job,
    ) -> Result<Cell, BenchError> {
        target.check_alive()?;
        let before = target.tree().sample();
        let sampler = Sampler {
            tree: target.tree(),
            beside,
            open: Mutex::new(None),
            close: Mutex::new(None),
        };
        let load_error = |source| BenchError::Load {
            target: target.kind().to_string(),
            case: case.to_string(),
            source: Box::new(source),
        };
        let mut report = match &job {
            Job::Handshake(j) => run_handshakes(j, &sampler),
            Job::Transfer(j) => run_transfer(j, &sampler),
            Job::Stream(j) => run_stream(j, &sampler),
        }
        .map_err(load_error)?;
        let open = sampler.open.into_inner().ok().flatten().unwrap_or_default();
        let close = sampler
            .close
            .into_inner()
            .ok()
            .flatten()
            .unwrap_or_default();
        check_negotiated(target, case, job.profile(), &report)?;
        target.check_alive()?;
        let mut core_busy = None;
        if beside.is_some() {
            let per_op = |ns: u64| ns as f64 / 1e3 / report.operations.max(1) as f64;
            let ns = close.beside_cpu_ns.saturating_sub(open.beside_cpu_ns);
            report
                .extra
                .insert("beside_cpu_us_per_op".into(), per_op(ns));
            report.extra.insert(
                "beside_utilization".into(),
                ns as f64 / 1e9 / report.window_secs.max(1e-9),
            );
            if let (Some(a), Some(b)) = (open.core, close.core) {
                let busy = b.busy_since(&a);
                report.extra.insert("client_core_busy".into(), busy);
                core_busy = Some(busy);
            }
        }
        let mut cell = Cell::new(
            scenario,
            case,
            target.kind(),
            repeat,
            report,
            close.target.cpu_ns.saturating_sub(open.target.cpu_ns),
            before.pss_bytes,
            open.target.pss_bytes,
            close.target.pss_bytes,
        );
        if core_busy.is_some_and(|b| generator_limited(b, cell.server_utilization)) {
            cell.generator_bound = true;
        }
        Ok(cell)
    }
}

/// Every handshake must have used exactly what the profile offered: a
/// target that negotiated something else would make the comparison void.
fn check_negotiated(
    target: &Target,
    case: &str,
    profile: &TlsProfile,
    report: &Report,
) -> Result<(), BenchError> {
    let version = match profile.version {
        Version::Tls12 => "TLSv1_2",
        Version::Tls13 => "TLSv1_3",
    };
    let suite = format!("{:?}", profile.suite().suite());
    let group = profile.group_name();
    for n in &report.negotiated {
        // A resumed TLS 1.2 session has no key exchange ("none").
        let group_ok = n.group == group || (profile.version == Version::Tls12 && n.group == "none");
        if n.version != version || n.suite != suite || !group_ok {
            return Err(BenchError::Insane {
                target: target.kind().to_string(),
                case: case.to_string(),
                problem: format!(
                    "negotiated {} {} {} ({} handshakes), expected {version} {suite} {group}",
                    n.version, n.suite, n.group, n.count
                ),
            });
        }
    }
    Ok(())
}
