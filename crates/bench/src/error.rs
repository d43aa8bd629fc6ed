//! Why a benchmark could not run.

use std::io;
use std::path::PathBuf;

/// A benchmark that could not run, with who is at fault.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A target program is missing (run `./dev setup`).
    #[error("{program} not found: {hint}")]
    Missing {
        /// The program.
        program: String,
        /// How to get it.
        hint: String,
    },
    /// A target did not start or died.
    #[error("{target} failed: {problem}\n{log}")]
    Target {
        /// Which target.
        target: String,
        /// What went wrong.
        problem: String,
        /// The end of its log.
        log: String,
    },
    /// The load generator could not run a job.
    #[error("load generator against {target} ({case}): {source}")]
    Load {
        /// Which target.
        target: String,
        /// Which case.
        case: String,
        /// Why.
        source: Box<tlsgate_loadgen::LoadError>,
    },
    /// A measurement was not sane (e.g. wrong cipher negotiated).
    #[error("{target} ({case}): {problem}")]
    Insane {
        /// Which target.
        target: String,
        /// Which case.
        case: String,
        /// What was wrong.
        problem: String,
    },
    /// Writing materials or results.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Anything else with a clear message.
    #[error("{0}")]
    Other(String),
}

impl BenchError {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { path, source }
    }
}
