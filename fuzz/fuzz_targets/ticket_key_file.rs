//! Fuzzes the ticket key file a fleet shares
//! (`tlsgate_tls::tickets::file::parse`, which every server reads at start
//! and whenever the file changes), on any bytes, and its writer `render`.
//!
//! Read as a file: never a panic; a file taken holds 1 to `MAX_KEYS` keys,
//! all different, exactly the base64 lines after the header (trimmed,
//! blank lines and `#` comments skipped) in order, and `render` of them
//! reads back as the same keys; a file refused says why without quoting
//! a key line (`parse`'s promise), checked for every line that decodes to
//! 32 bytes in any base64 spelling (standard or URL-safe, padded or not).
//!
//! Read as keys (32 bytes each, as many as the input holds): their
//! `render` reads back as them when there are 1 to `MAX_KEYS`, all
//! different; else it is refused for the repeated key (naming its two
//! lines), for more than `MAX_KEYS` keys, or for none, whichever the
//! reader meets first, and again without quoting a key.

#![no_main]

use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
use base64::Engine;
use libfuzzer_sys::fuzz_target;
use tlsgate_tls::tickets::file::{parse, render, HEADER, KEY_LEN, MAX_KEYS};
use tlsgate_tls::tickets::Secret;

fn bytes(keys: &[Secret]) -> Vec<[u8; KEY_LEN]> {
    keys.iter().map(|k| *k.expose()).collect()
}

/// Asserts that `error` quotes no line of `text` that is a key in some
/// base64 spelling, whole or its first 20 characters.
fn quotes_no_key(error: &str, text: &str) {
    for line in text.lines().map(str::trim) {
        let is_key = [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
            .iter()
            .any(|e| e.decode(line).is_ok_and(|k| k.len() == KEY_LEN));
        if is_key {
            assert!(
                !error.contains(line) && !error.contains(&line[..20]),
                "the error quotes a key line: {error:?}"
            );
        }
    }
}

/// The keys of a file, read here without the reader: the trimmed lines
/// after the first, blank ones and `#` comments skipped, each standard
/// base64 of `KEY_LEN` bytes (`None` if one is not).
fn model(text: &str) -> Option<Vec<[u8; KEY_LEN]>> {
    text.split('\n')
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| STANDARD.decode(l).ok()?.try_into().ok())
        .collect()
}

fn as_file(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match parse(data) {
        Ok(keys) => {
            assert!(
                std::str::from_utf8(data).is_ok(),
                "took a file that is not text"
            );
            let keys = bytes(&keys);
            assert!((1..=MAX_KEYS).contains(&keys.len()), "{} keys", keys.len());
            for (i, k) in keys.iter().enumerate() {
                assert!(!keys[..i].contains(k), "key {} repeats", i + 1);
            }
            assert_eq!(text.lines().next().map(str::trim), Some(HEADER));
            assert_eq!(model(&text).as_ref(), Some(&keys), "not the file's keys");
            let secrets: Vec<Secret> = keys.iter().map(|k| Secret::from_bytes(*k)).collect();
            let again = parse(render(&secrets).as_bytes()).expect("render reads back");
            assert_eq!(bytes(&again), keys, "render reads back as other keys");
        }
        Err(e) => {
            assert!(!e.is_empty());
            quotes_no_key(&e, &text);
        }
    }
}

fn as_keys(data: &[u8]) {
    let keys: Vec<[u8; KEY_LEN]> = data
        .chunks_exact(KEY_LEN)
        .map(|c| c.try_into().expect("KEY_LEN bytes"))
        .collect();
    let secrets: Vec<Secret> = keys.iter().map(|k| Secret::from_bytes(*k)).collect();
    let text = render(&secrets);
    // The first key that repeats one before it, as (its index, the first's).
    let repeat = keys
        .iter()
        .enumerate()
        .find_map(|(i, k)| Some((i, keys[..i].iter().position(|e| e == k)?)));
    match parse(text.as_bytes()) {
        Ok(again) => {
            assert!(repeat.is_none() && (1..=MAX_KEYS).contains(&keys.len()));
            assert_eq!(bytes(&again), keys, "render reads back as other keys");
        }
        Err(e) => {
            quotes_no_key(&e, &text);
            // The line (from 1) that holds key `i`: one a key, in order.
            let line_of = |i: usize| {
                let b64 = STANDARD.encode(keys[0]);
                i + 1 + text.lines().position(|l| l == b64).expect("a line per key")
            };
            match repeat {
                Some((i, first)) if i <= MAX_KEYS => assert_eq!(
                    e,
                    format!(
                        "line {}: repeats the key of line {}",
                        line_of(i),
                        line_of(first)
                    )
                ),
                _ if keys.len() > MAX_KEYS => assert_eq!(e, format!("more than {MAX_KEYS} keys")),
                _ => {
                    assert!(keys.is_empty(), "{} keys refused: {e}", keys.len());
                    assert!(e.contains("at least one key"), "{e}");
                }
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    as_file(data);
    as_keys(data);
});
