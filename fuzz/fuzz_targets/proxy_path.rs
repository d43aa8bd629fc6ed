//! Fuzzes the proxy's two readings of a request path: `normalize` (what
//! goes upstream) and `route_view` (what routes match). Beyond not
//! panicking, a path that gets through must leave no way around routing:
//! what goes upstream starts with `/` and has no dot-segment or empty
//! segment left to resolve, normalizing it again changes nothing, and
//! routes read it exactly as they read what the client sent, so an
//! upstream that resolves the path itself lands where the route said.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tlsgate_proxy::path::{normalize, route_view};

fn path_of(target: &[u8]) -> &[u8] {
    target.split(|&b| b == b'?').next().unwrap_or_default()
}

fuzz_target!(|target: &[u8]| {
    let Ok(out) = normalize(target) else {
        return;
    };
    if !target.starts_with(b"/") {
        assert_eq!(&*out, target, "only origin-form paths are rewritten");
        return;
    }
    let path = path_of(&out);
    assert!(path.starts_with(b"/"), "{out:?}");
    let segments: Vec<&[u8]> = path[1..].split(|&b| b == b'/').collect();
    for (i, seg) in segments.iter().enumerate() {
        assert!(seg != b"." && seg != b"..", "dot-segment left in {out:?}");
        assert!(
            !seg.is_empty() || i + 1 == segments.len(),
            "empty segment in {out:?}"
        );
    }
    let again = normalize(&out).expect("a normalized path is accepted again");
    assert_eq!(again, out, "normalizing twice changed the path");
    let routed = route_view(path_of(target)).expect("normalize accepted its path");
    let routed_after = route_view(path).expect("a normalized path routes");
    assert_eq!(
        routed, routed_after,
        "routes read the upstream's path differently"
    );
});
