//! Static-file serving logic for tlsgate that does not touch the network.
//!
//! This crate covers three concerns:
//!
//! * [`root`] — mapping a raw, percent-encoded request path to a file under a
//!   document root, with the kernel (`openat2` + `RESOLVE_BENEATH`) enforcing
//!   that neither `..`, symlinks nor races can escape the root;
//! * [`meta`] — validators (strong `ETag`, `Last-Modified`) and the
//!   `Content-Type` of a file, plus HTTP-date helpers;
//! * [`cache`] — the open-file cache: descriptors and validators of recently
//!   served files, per worker thread;
//! * [`select`](mod@select) — pure evaluation of conditional request headers
//!   (RFC 9110 §13.2.2) and single byte ranges (RFC 9110 §14).
//!
//! Errors live in [`error`]. Nothing in this crate panics on any input.
#![forbid(unsafe_code)]

pub mod cache;
pub mod error;
pub mod meta;
pub mod root;
pub mod select;

pub use cache::CacheOptions;
pub use error::{LookupError, RootError};
pub use meta::{content_type_for, http_date, parse_http_date, FileMeta};
pub use root::{DocumentRoot, Found, RootOptions, StaticFile};
pub use select::{select, select_at, Preconditions, Selection};
