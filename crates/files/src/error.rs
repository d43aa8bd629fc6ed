//! Error types for opening a document root and looking up request paths.

use std::path::PathBuf;

/// Failure to open a [`DocumentRoot`](crate::DocumentRoot).
///
/// Every variant's message names the offending path (or index file name).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RootError {
    /// The document root does not exist or cannot be resolved.
    #[error("document root {}: {source}", path.display())]
    Resolve {
        /// The path as given to [`DocumentRoot::open`](crate::DocumentRoot::open).
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The document root exists but is not a directory.
    #[error("document root {} is not a directory", path.display())]
    NotADirectory {
        /// The path as given to [`DocumentRoot::open`](crate::DocumentRoot::open).
        path: PathBuf,
    },
    /// The document root directory could not be opened.
    #[error("cannot open document root {}: {source}", path.display())]
    Open {
        /// The canonical path of the root.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A configured index file name is not a plain file name
    /// (empty, `.`, `..`, or containing `/` or NUL).
    #[error("invalid index file name {name:?} for document root {}", path.display())]
    InvalidIndexFile {
        /// The rejected index file name.
        name: String,
        /// The path as given to [`DocumentRoot::open`](crate::DocumentRoot::open).
        path: PathBuf,
    },
}

/// Why a request path could not be mapped to a servable file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LookupError {
    /// The request path is malformed: not starting with `/`, an invalid
    /// percent escape, an encoded NUL, or `..` climbing above the root (400).
    #[error("bad request path")]
    BadPath,
    /// Nothing exists at the path (404).
    #[error("not found")]
    NotFound,
    /// Something exists but must not be served: a directory without an index
    /// file, a symlink escaping the root, or a non-regular file (403).
    #[error("forbidden")]
    Forbidden,
    /// The process or the system ran out of file descriptors
    /// (`EMFILE`/`ENFILE`) opening the file (503).
    #[error("out of file descriptors: {0}")]
    NoDescriptors(#[source] std::io::Error),
    /// Unexpected I/O failure (500).
    #[error("i/o error: {0}")]
    Io(#[source] std::io::Error),
}

impl LookupError {
    /// The HTTP status code this error maps to.
    pub fn status(&self) -> u16 {
        match self {
            LookupError::BadPath => 400,
            LookupError::NotFound => 404,
            LookupError::Forbidden => 403,
            // 503, not 500: nothing is wrong with the file or the
            // server's state, only its load; the same request succeeds
            // once descriptors are free again, and 503 tells clients and
            // balancers to retry (elsewhere) rather than report a fault.
            LookupError::NoDescriptors(_) => 503,
            LookupError::Io(_) => 500,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        assert_eq!(LookupError::BadPath.status(), 400);
        assert_eq!(LookupError::NotFound.status(), 404);
        assert_eq!(LookupError::Forbidden.status(), 403);
        assert_eq!(LookupError::Io(std::io::Error::other("x")).status(), 500);
        assert_eq!(
            LookupError::NoDescriptors(std::io::Error::other("x")).status(),
            503
        );
    }

    #[test]
    fn root_error_names_path() {
        let e = RootError::NotADirectory {
            path: PathBuf::from("/some/where"),
        };
        assert!(e.to_string().contains("/some/where"));
    }
}
