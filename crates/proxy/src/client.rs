//! What the proxy keeps of one client connection across its requests:
//! where it came from and to, and the upstream connections private to it.
//!
//! A pool with `proxy_protocol` begins each connection with a header that
//! names the client (HAProxy's `send-proxy`). Such a connection speaks
//! for that client only: it is never put in the pool's shared idle lists,
//! but kept here, reused by the same client connection's next requests
//! and closed with it, as HAProxy keeps its "private" server connections.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ppp::{v1, v2};
use tlsgate_config::{PassedFields, ProxyProtocol};

use crate::conn::UpstreamConn;

/// Idle private connections kept per client connection, all pools
/// together (and no more than a pool's `max_idle` of one pool's). An
/// HTTP/1.1 client needs one per server it is routed to; an HTTP/2 client
/// with streams in flight may have opened more: the oldest idle ones go.
pub const PRIVATE_IDLE_MAX: usize = 4;

/// A private connection waiting for its client's next request.
struct Kept {
    /// The pool that opened it.
    pool: u64,
    /// Its pool's `idle_timeout` from when it became idle.
    until: Instant,
    conn: UpstreamConn,
}

/// One client connection as the proxy sees it.
pub struct ClientConn {
    /// The client's address (the one a PROXY protocol header on the
    /// listener named, if any).
    pub peer: SocketAddr,
    /// The address it connected to, when known (the listener's side of
    /// the socket, or the destination a balancer's header named).
    pub destination: Option<SocketAddr>,
    /// The server name the client asked for in its TLS handshake (SNI).
    pub server_name: Option<String>,
    /// The address the client connected to, when it sent no SNI.
    pub local: Option<SocketAddr>,
    /// The fields its listener lets pass from it (`pass_client_headers`).
    pub passed: PassedFields,
    /// Idle connections that carry this client's PROXY protocol header,
    /// oldest first.
    idle: Mutex<Vec<Kept>>,
}

impl ClientConn {
    /// A client connection from `peer` to `destination`.
    pub fn new(peer: SocketAddr, destination: Option<SocketAddr>) -> Self {
        Self {
            peer,
            destination,
            server_name: None,
            local: None,
            passed: PassedFields::default(),
            idle: Mutex::new(Vec::new()),
        }
    }

    /// The same, for a client that asked for `name` in its TLS handshake
    /// (and, without one, connected to `local`).
    #[must_use]
    pub fn with_server_name(mut self, name: Option<String>, local: Option<SocketAddr>) -> Self {
        self.server_name = name;
        self.local = local;
        self
    }

    /// The same, on a listener that lets `passed` through from its clients.
    #[must_use]
    pub fn passing(mut self, passed: PassedFields) -> Self {
        self.passed = passed;
        self
    }

    /// The `Host` sent upstream for a request whose own is empty or absent
    /// (an HTTP/1.0 request): the name the client asked for in its TLS
    /// handshake, else the address it connected to (nginx's `$host` is
    /// the request's Host, else the name of the server that matched).
    pub(crate) fn fallback_host(&self) -> Vec<u8> {
        if let Some(n) = &self.server_name {
            return n.clone().into_bytes();
        }
        self.destination
            .or(self.local)
            .map_or_else(|| b"localhost".to_vec(), |a| a.to_string().into_bytes())
    }

    /// The header that introduces this client to a server.
    pub(crate) fn header(&self, version: ProxyProtocol) -> Vec<u8> {
        let (source, destination) = addresses(self.peer, self.destination);
        match version {
            ProxyProtocol::V1 => v1::Addresses::from((source, destination))
                .to_string()
                .into_bytes(),
            ProxyProtocol::V2 => v2::Builder::with_addresses(
                v2::Version::Two | v2::Command::Proxy,
                v2::Protocol::Stream,
                (source, destination),
            )
            .build()
            // Only writing a TLV can fail; no TLV is written.
            .unwrap_or_default(),
        }
    }

    /// A private idle connection of pool `pool` to server `server`, if one
    /// is still usable.
    pub(crate) fn take(
        &self,
        pool: u64,
        server: usize,
        usable: impl Fn(&UpstreamConn) -> bool,
    ) -> Option<UpstreamConn> {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        prune(&mut idle);
        // This server's that can no longer be used go too.
        idle.retain(|k| k.pool != pool || k.conn.server != server || usable(&k.conn));
        let i = idle
            .iter()
            .position(|k| k.pool == pool && k.conn.server == server)?;
        Some(idle.remove(i).conn)
    }

    /// Keeps a private connection for this client's next requests, for up
    /// to `idle_timeout`; the oldest kept one goes when `max_idle` of its
    /// pool or [`PRIVATE_IDLE_MAX`] are kept already (none with
    /// `max_idle = 0`).
    pub(crate) fn keep(
        &self,
        pool: u64,
        mut conn: UpstreamConn,
        (idle_timeout, max_idle): (Duration, usize),
    ) {
        let cap = max_idle.min(PRIVATE_IDLE_MAX);
        if cap == 0 {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        prune(&mut idle);
        while idle.iter().filter(|k| k.pool == pool).count() >= cap {
            if let Some(i) = idle.iter().position(|k| k.pool == pool) {
                idle.remove(i);
            }
        }
        while idle.len() >= PRIVATE_IDLE_MAX {
            idle.remove(0);
        }
        let now = Instant::now();
        conn.idle_since = now;
        idle.push(Kept {
            pool,
            until: now + idle_timeout,
            conn,
        });
    }
}

/// Lets go of kept connections past their idle timeout, closed by their
/// server (which costs no system call while tokio knows them quiet), or
/// opened before their server was last taken out of service.
fn prune(idle: &mut Vec<Kept>) {
    let now = Instant::now();
    idle.retain(|k| now < k.until && !k.conn.predates_an_outage() && k.conn.looks_alive());
}

/// The header of a connection the proxy opens for itself (a health
/// check): v2 `LOCAL`, v1 `UNKNOWN`; the server uses the connection's own
/// addresses.
pub(crate) fn local_header(version: ProxyProtocol) -> Vec<u8> {
    match version {
        ProxyProtocol::V1 => v1::Addresses::Unknown.to_string().into_bytes(),
        ProxyProtocol::V2 => v2::Builder::new(
            v2::Version::Two | v2::Command::Local,
            v2::AddressFamily::Unspecified | v2::Protocol::Unspecified,
        )
        .build()
        .unwrap_or_default(),
    }
}

/// The two addresses of a header, in one family: IPv4-mapped ones as IPv4,
/// and both as IPv6 when only one is IPv4. A destination not known is the
/// unspecified address of the source's family, port 0.
fn addresses(peer: SocketAddr, destination: Option<SocketAddr>) -> (SocketAddr, SocketAddr) {
    let canonical = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
    let source = canonical(peer);
    let destination = destination.map_or_else(
        || {
            let any = match source.ip() {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            };
            SocketAddr::new(any, 0)
        },
        canonical,
    );
    match (source.ip(), destination.ip()) {
        (IpAddr::V4(s), IpAddr::V6(_)) => (
            SocketAddr::new(IpAddr::V6(s.to_ipv6_mapped()), source.port()),
            destination,
        ),
        (IpAddr::V6(_), IpAddr::V4(d)) => (
            source,
            SocketAddr::new(IpAddr::V6(d.to_ipv6_mapped()), destination.port()),
        ),
        _ => (source, destination),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(peer: &str, destination: Option<&str>) -> ClientConn {
        ClientConn::new(
            peer.parse().unwrap(),
            destination.map(|d| d.parse().unwrap()),
        )
    }

    #[test]
    fn v1_names_the_client_and_where_it_connected() {
        let c = client("203.0.113.7:40000", Some("192.0.2.1:443"));
        assert_eq!(
            c.header(ProxyProtocol::V1),
            b"PROXY TCP4 203.0.113.7 192.0.2.1 40000 443\r\n"
        );
        let c = client("[2001:db8::7]:40000", Some("[2001:db8::1]:443"));
        assert_eq!(
            c.header(ProxyProtocol::V1),
            b"PROXY TCP6 2001:db8::7 2001:db8::1 40000 443\r\n"
        );
    }

    #[test]
    fn v2_names_the_client_and_where_it_connected() {
        let c = client("203.0.113.7:40000", Some("192.0.2.1:443"));
        let h = c.header(ProxyProtocol::V2);
        let mut want = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
        // PROXY, TCP over IPv4, 12 bytes of addresses.
        want.extend_from_slice(&[0x21, 0x11, 0, 12, 203, 0, 113, 7, 192, 0, 2, 1]);
        want.extend_from_slice(&40000u16.to_be_bytes());
        want.extend_from_slice(&443u16.to_be_bytes());
        assert_eq!(h, want);
        // And ppp reads back what it wrote.
        let parsed = v2::Header::try_from(h.as_slice()).unwrap();
        assert_eq!(parsed.command, v2::Command::Proxy);
    }

    #[test]
    fn mixed_families_are_sent_as_ipv6_and_mapped_ones_as_ipv4() {
        let c = client("[::ffff:203.0.113.7]:1", Some("[::ffff:192.0.2.1]:443"));
        assert_eq!(
            c.header(ProxyProtocol::V1),
            b"PROXY TCP4 203.0.113.7 192.0.2.1 1 443\r\n"
        );
        let c = client("203.0.113.7:1", Some("[2001:db8::1]:443"));
        assert_eq!(
            c.header(ProxyProtocol::V1),
            b"PROXY TCP6 ::ffff:203.0.113.7 2001:db8::1 1 443\r\n"
        );
        let c = client("203.0.113.7:1", None);
        assert_eq!(
            c.header(ProxyProtocol::V1),
            b"PROXY TCP4 203.0.113.7 0.0.0.0 1 0\r\n"
        );
    }

    /// A plain connection to a local listener, its peer end kept open
    /// in `peers` (a closed one would be let go as closed by its server).
    async fn conn(
        listener: &tokio::net::TcpListener,
        server: usize,
        peers: &mut Vec<tokio::net::TcpStream>,
    ) -> (UpstreamConn, u16) {
        let addr = listener.local_addr().unwrap();
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        peers.push(listener.accept().await.unwrap().0);
        let port = tcp.local_addr().unwrap().port();
        let gauge = tlsgate_metrics::types::Gauge::default();
        (
            UpstreamConn::new(
                crate::conn::Stream::Plain(tcp),
                (server, addr),
                gauge,
                Default::default(),
            ),
            port,
        )
    }

    fn port(c: Option<UpstreamConn>) -> Option<u16> {
        c.map(|c| match &c.stream {
            crate::conn::Stream::Plain(t) => t.local_addr().unwrap().port(),
            crate::conn::Stream::Tls(_) => unreachable!(),
        })
    }

    #[tokio::test]
    async fn kept_connections_are_bounded_per_pool_and_in_all_the_oldest_going_first() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut peers = Vec::new();
        let client = client("203.0.113.7:1", None);
        let minute = Duration::from_secs(60);
        // Pool 1 keeps at most 2 (its max_idle): the first of three goes.
        let mut ports = Vec::new();
        for _ in 0..3 {
            let (c, p) = conn(&listener, 0, &mut peers).await;
            client.keep(1, c, (minute, 2));
            ports.push(p);
        }
        // Only this pool's, and only this server's, are taken.
        assert_eq!(port(client.take(2, 0, |_| true)), None);
        assert_eq!(port(client.take(1, 1, |_| true)), None);
        let mut taken = [
            port(client.take(1, 0, |_| true)),
            port(client.take(1, 0, |_| true)),
        ];
        taken.sort();
        assert_eq!(taken, [Some(ports[1]), Some(ports[2])]);
        assert_eq!(port(client.take(1, 0, |_| true)), None);
        // max_idle = 0 keeps none.
        let (c, _) = conn(&listener, 0, &mut peers).await;
        client.keep(3, c, (minute, 0));
        assert_eq!(port(client.take(3, 0, |_| true)), None);
        // Five from two pools: the oldest goes (PRIVATE_IDLE_MAX = 4).
        let mut first = None;
        for pool in [1, 1, 1, 2, 2] {
            let (c, p) = conn(&listener, 0, &mut peers).await;
            first.get_or_insert(p);
            client.keep(pool, c, (minute, 100));
        }
        let mut left = Vec::new();
        while let Some(p) = port(client.take(1, 0, |_| true)) {
            left.push(p);
        }
        assert_eq!(left.len(), 2);
        assert!(!left.contains(&first.unwrap()));
        // Unusable ones of the server asked for are let go, not returned.
        assert_eq!(port(client.take(2, 0, |_| false)), None);
        assert_eq!(port(client.take(2, 0, |_| true)), None);
        // Past the idle timeout: let go.
        let (c, _) = conn(&listener, 0, &mut peers).await;
        client.keep(4, c, (Duration::from_millis(1), 100));
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert_eq!(port(client.take(4, 0, |_| true)), None);
    }

    #[test]
    fn a_health_check_says_it_is_the_proxys_own() {
        assert_eq!(local_header(ProxyProtocol::V1), b"PROXY UNKNOWN\r\n");
        let h = local_header(ProxyProtocol::V2);
        assert_eq!(h.len(), 16);
        assert_eq!(&h[12..], &[0x20, 0x00, 0, 0]);
    }
}
