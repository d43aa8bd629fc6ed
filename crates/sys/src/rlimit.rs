//! The descriptor limit (`RLIMIT_NOFILE`): raised at start from its soft
//! value to its hard one, as nginx's `worker_rlimit_nofile` and most
//! servers do. systemd and login shells start services with a soft limit
//! of 1024 and a hard one far above it (524288 under systemd); the soft
//! one exists for old `select(2)` programs, which tlsgate is not.
//! `rustix`'s `getrlimit`/`setrlimit` are safe wrappers: no `unsafe` here.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// The descriptor limit before and after [`raise_nofile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nofile {
    /// The soft limit found at start (`None`: unlimited).
    pub was: Option<u64>,
    /// The soft limit now (`None`: unlimited).
    pub now: Option<u64>,
    /// Why it could not be raised, if it could not.
    pub error: Option<rustix::io::Errno>,
}

/// Sets the soft `RLIMIT_NOFILE` to the hard one.
pub fn raise_nofile() -> Nofile {
    let limit = getrlimit(Resource::Nofile);
    let was = limit.current;
    if limit.current == limit.maximum {
        return Nofile {
            was,
            now: was,
            error: None,
        };
    }
    let raised = Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => Nofile {
            was,
            now: getrlimit(Resource::Nofile).current,
            error: None,
        },
        Err(e) => Nofile {
            was,
            now: was,
            error: Some(e),
        },
    }
}
