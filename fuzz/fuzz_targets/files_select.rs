//! Fuzzes `select`, which reads a request's conditional and `Range`
//! headers against a file. It must never panic, and what it answers must
//! be sendable: a 206 range lies inside the file, an empty file has no
//! range to send, methods other than GET and HEAD get neither 206 nor 304,
//! and without a `Range` there is no 206 or 416.
//!
//! Input: one byte of flags (which of the six headers are present, and
//! whether the method is GET), eight bytes of file length (kept below
//! 2^40, or 0), then the header values separated by newlines.

#![no_main]

use std::time::{Duration, UNIX_EPOCH};

use libfuzzer_sys::fuzz_target;
use tlsgate_files::{select, FileMeta, Preconditions, Selection};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let Some((len, rest)) = rest.split_first_chunk::<8>() else {
        return;
    };
    let len = u64::from_le_bytes(*len) % (1 << 40);
    let mut values = rest.split(|&b| b == b'\n');
    let mut next = |bit: u8| {
        let value = values.next();
        if flags & bit != 0 {
            value
        } else {
            None
        }
    };
    let pre = Preconditions {
        if_match: next(1),
        if_none_match: next(2),
        if_modified_since: next(4),
        if_unmodified_since: next(8),
        if_range: next(16),
        range: next(32),
    };
    let get_or_head = flags & 64 != 0;
    let meta = FileMeta {
        len,
        modified: UNIX_EPOCH + Duration::from_secs(1_700_000_000),
        etag: "\"5f3-1b-17f0\"".to_owned(),
        content_type: "text/plain; charset=utf-8",
    };
    match select(&pre, &meta, get_or_head) {
        Selection::Partial {
            start,
            end_inclusive,
        } => {
            assert!(get_or_head && pre.range.is_some());
            assert!(
                start <= end_inclusive && end_inclusive < len,
                "{start}-{end_inclusive} of {len}"
            );
        }
        Selection::Unsatisfiable => assert!(get_or_head && pre.range.is_some()),
        Selection::NotModified => assert!(get_or_head),
        Selection::Full | Selection::PreconditionFailed => {}
    }
});
