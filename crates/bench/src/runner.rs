//! Runs one load job against one target and turns the generator's report
//! and the server's /proc samples, taken at the window's edges, into a
//! [`Cell`].

use std::sync::Mutex;

use tlsgate_loadgen::{
    run_handshakes, run_stream, run_transfer, HandshakeJob, Observer, Report, StreamJob,
    TlsProfile, TransferJob, Version,
};

use crate::error::BenchError;
use crate::proc::{ProcessTree, Sample};
use crate::report::Cell;
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

/// Samples the server's process tree when the window opens and closes.
struct Sampler<'a> {
    tree: &'a ProcessTree,
    open: Mutex<Option<Sample>>,
    close: Mutex<Option<Sample>>,
}

impl Observer for Sampler<'_> {
    fn window_opened(&self) {
        let s = self.tree.sample();
        if let Ok(mut o) = self.open.lock() {
            *o = Some(s);
        }
    }
    fn window_closed(&self) {
        let s = self.tree.sample();
        if let Ok(mut c) = self.close.lock() {
            *c = Some(s);
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
        target.check_alive()?;
        let before = target.tree().sample();
        let sampler = Sampler {
            tree: target.tree(),
            open: Mutex::new(None),
            close: Mutex::new(None),
        };
        let load_error = |source| BenchError::Load {
            target: target.kind().to_string(),
            case: case.to_string(),
            source: Box::new(source),
        };
        let report = match &job {
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
        Ok(Cell::new(
            scenario,
            case,
            target.kind(),
            repeat,
            report,
            close.cpu_ns.saturating_sub(open.cpu_ns),
            before.pss_bytes,
            open.pss_bytes,
            close.pss_bytes,
        ))
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
