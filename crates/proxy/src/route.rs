//! Routes of one listener: a request's Host (port ignored), its TLS
//! server name and its path choose a target; the longest matching path
//! prefix wins, then a route naming a host or SNI over one that does not,
//! then the first in the file. Prefixes match at segment boundaries:
//! `/api` takes `/api` and `/api/x`, not `/apix`; and they match the
//! path as any of its readers could take it (`/api/../admin` and
//! `/x%2f..%2fadmin` are `/admin`, see [`crate::path::route_view`]).

use std::sync::Arc;

use tlsgate_config::{Route, RouteTarget};
use tlsgate_http1::host_without_port;

use crate::path::BadPath;
use crate::pool::{Pool, Pools};

/// Where a routed request goes: a pool, or a static root of type `R`.
pub enum Target<R> {
    /// Forwarded to this pool.
    Pool(Arc<Pool>),
    /// Served from this root.
    Static(R),
}

/// A route, built.
pub struct Entry<R> {
    route: Route,
    /// Where its requests go.
    pub target: Target<R>,
}

impl<R> Entry<R> {
    /// The request body limit of the route.
    pub fn max_body_bytes(&self) -> u64 {
        self.route.max_body_bytes
    }
}

/// The routes of one listener.
pub struct Router<R> {
    entries: Vec<Entry<R>>,
}

impl<R> Default for Router<R> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
        }
    }
}

impl<R> Router<R> {
    /// Builds the routes; `open_root` opens a static root (errors name the route's key).
    pub fn build<E>(
        routes: &[Route],
        pools: &Pools,
        mut open_root: impl FnMut(&Route, &std::path::Path) -> Result<R, E>,
    ) -> Result<Self, E> {
        let mut entries = Vec::with_capacity(routes.len());
        for r in routes {
            let target = match &r.target {
                RouteTarget::Upstream(i) => match pools.get(*i) {
                    Some(p) => Target::Pool(p.clone()),
                    // Validation resolved every name to an index.
                    None => continue,
                },
                RouteTarget::Root(path) => Target::Static(open_root(r, path)?),
            };
            entries.push(Entry {
                route: r.clone(),
                target,
            });
        }
        Ok(Self { entries })
    }

    /// The static roots routes lead to.
    pub fn static_roots(&self) -> impl Iterator<Item = &R> {
        self.entries.iter().filter_map(|e| match &e.target {
            Target::Static(r) => Some(r),
            Target::Pool(_) => None,
        })
    }

    /// Whether a route leads to an upstream pool.
    pub fn has_pools(&self) -> bool {
        self.entries
            .iter()
            .any(|e| matches!(e.target, Target::Pool(_)))
    }

    /// Whether the listener has no routes.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The route for a request, or `None` for the listener's own root;
    /// `BadPath` for a path that must be refused whatever its route (see
    /// [`crate::path`]).
    pub fn find(
        &self,
        host: Option<&[u8]>,
        sni: Option<&str>,
        path: &[u8],
    ) -> Result<Option<&Entry<R>>, BadPath> {
        if self.entries.is_empty() {
            return Ok(None);
        }
        let normal = crate::path::route_view(path)?;
        let path: &[u8] = &normal;
        let host = host.map(host_without_port);
        let mut best: Option<(&Entry<R>, usize, bool)> = None;
        for e in &self.entries {
            let r = &e.route;
            if let Some(want) = &r.host {
                if !host.is_some_and(|h| name_matches(want, h)) {
                    continue;
                }
            }
            if let Some(want) = &r.sni {
                if !sni.is_some_and(|s| name_matches(want, s.as_bytes())) {
                    continue;
                }
            }
            if !prefix_matches(r.path.as_bytes(), path) {
                continue;
            }
            let len = r.path.len();
            let specific = r.host.is_some() || r.sni.is_some();
            let better = match best {
                None => true,
                Some((_, l, s)) => len > l || (len == l && specific && !s),
            };
            if better {
                best = Some((e, len, specific));
            }
        }
        Ok(best.map(|(e, _, _)| e))
    }
}

/// `want` is lower case, exact or `*.suffix`. A wildcard covers exactly
/// one label, as in certificates (RFC 6125 §6.4.3) and their lookup by
/// SNI: a route's wildcard must take no name that the certificate entry
/// of the same wildcard does not, or a host under it could escape that
/// entry's client certificate policy.
fn name_matches(want: &str, got: &[u8]) -> bool {
    let got = got.strip_suffix(b".").unwrap_or(got);
    match want.strip_prefix('*') {
        Some(suffix) => got
            .len()
            .checked_sub(suffix.len())
            .and_then(|at| got.split_at_checked(at))
            .is_some_and(|(label, tail)| {
                !label.is_empty()
                    && !label.contains(&b'.')
                    && tail.eq_ignore_ascii_case(suffix.as_bytes())
            }),
        None => got.eq_ignore_ascii_case(want.as_bytes()),
    }
}

fn prefix_matches(prefix: &[u8], path: &[u8]) -> bool {
    if prefix == b"/" {
        return true;
    }
    let prefix = prefix.strip_suffix(b"/").unwrap_or(prefix);
    match path.strip_prefix(prefix) {
        Some(rest) => rest.is_empty() || rest.first() == Some(&b'/'),
        None => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn route(host: Option<&str>, sni: Option<&str>, path: &str, root: &str) -> Route {
        Route {
            key_path: String::new(),
            host: host.map(str::to_string),
            sni: sni.map(str::to_string),
            path: path.into(),
            target: RouteTarget::Root(root.into()),
            max_body_bytes: 0,
        }
    }

    fn router(routes: &[Route]) -> Router<String> {
        let pools = Pools {
            pools: Vec::new(),
            workers: 1,
        };
        Router::build(routes, &pools, |_, p| Ok::<_, ()>(p.display().to_string()))
            .unwrap_or_default()
    }

    fn find(r: &Router<String>, host: &str, sni: Option<&str>, path: &str) -> Option<String> {
        r.find(Some(host.as_bytes()), sni, path.as_bytes())
            .unwrap()
            .map(|e| match &e.target {
                Target::Static(s) => s.clone(),
                Target::Pool(_) => "pool".into(),
            })
    }

    #[test]
    fn longest_prefix_then_specific_then_first() {
        let r = router(&[
            route(None, None, "/", "any"),
            route(None, None, "/api", "api"),
            route(None, None, "/api/v2/", "v2"),
            route(Some("app.example.com"), None, "/api", "app-api"),
            route(Some("*.example.com"), None, "/api", "wild-api"),
            route(None, Some("b.example.com"), "/b", "sni-b"),
        ]);
        // Roots only (a pool's route: tests/proxy.rs).
        assert!(!r.has_pools());
        assert_eq!(
            find(&r, "x.test", None, "/index.html").as_deref(),
            Some("any")
        );
        assert_eq!(find(&r, "x.test", None, "/api").as_deref(), Some("api"));
        assert_eq!(find(&r, "x.test", None, "/apix").as_deref(), Some("any"));
        assert_eq!(find(&r, "x.test", None, "/api/v2/x").as_deref(), Some("v2"));
        assert_eq!(find(&r, "x.test", None, "/api/v2").as_deref(), Some("v2"));
        assert_eq!(
            find(&r, "APP.example.com:8443", None, "/api/1").as_deref(),
            Some("app-api")
        );
        assert_eq!(
            find(&r, "z.example.com", None, "/api").as_deref(),
            Some("wild-api")
        );
        assert_eq!(
            find(&r, "example.com", None, "/api").as_deref(),
            Some("api")
        );
        // One label, as a certificate's wildcard.
        assert_eq!(
            find(&r, "x.z.example.com", None, "/api").as_deref(),
            Some("api")
        );
        assert_eq!(
            find(&r, ".example.com", None, "/api").as_deref(),
            Some("api")
        );
        assert_eq!(
            find(&r, "x.test", Some("b.example.com"), "/b/1").as_deref(),
            Some("sni-b")
        );
        assert_eq!(
            find(&r, "x.test", Some("c.example.com"), "/b/1").as_deref(),
            Some("any")
        );
        // Dot-segments and repeated slashes cannot lead around a route.
        assert_eq!(
            find(&r, "x.test", None, "/x/../api/1").as_deref(),
            Some("api")
        );
        assert_eq!(
            find(&r, "x.test", None, "/api/%2e%2e/b/1").as_deref(),
            Some("any")
        );
        assert_eq!(
            find(&r, "x.test", Some("b.example.com"), "/api/%2E./b/1").as_deref(),
            Some("sni-b")
        );
        // Paths its readers could disagree on: refused, whatever the route.
        assert!(r.find(Some(b"x.test"), None, b"/x%2f..%2fapi").is_err());

        assert_eq!(find(&r, "x.test", None, "//api").as_deref(), Some("api"));
        assert_eq!(
            find(&r, "x.test", None, "/api/v2/../x").as_deref(),
            Some("api")
        );
        let none = router(&[route(None, None, "/only", "o")]);
        assert_eq!(find(&none, "x", None, "/"), None);
        assert!(none.find(Some(b"x"), None, b"/../only").is_err());
    }
}
