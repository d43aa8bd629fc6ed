//! The PROXY protocol (HAProxy's; v1 text, v2 binary) on listeners behind
//! a load balancer that replaces the client's address with its own: a
//! connection from a source in `proxy_protocol_from` begins with a header
//! naming the client, and the limits, the access log and the forwarding
//! headers use that address instead of the balancer's.
//!
//! Only the header's bytes are taken from the socket (peeked, then read
//! exactly), so the TLS handshake that follows reads its ClientHello as
//! from any other connection.

use std::net::{IpAddr, SocketAddr};

use ppp::{v1, v2, PartialResult};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The longest header taken: v2's 16 fixed bytes, its addresses (216 for
/// Unix sockets) and the TLVs cloud balancers add (tens of bytes).
pub const MAX_HEADER: usize = 1024;

/// Who a header says the connection is from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A proxied client and the address it connected to (IPv4-mapped
    /// IPv6 addresses given as IPv4).
    Client {
        /// The client.
        source: SocketAddr,
        /// Where it connected (the balancer's front, or this listener).
        destination: SocketAddr,
    },
    /// v2 `LOCAL` (the balancer's own connection, e.g. a health check) or
    /// v1 `UNKNOWN`: the connection's own peer is the client.
    Balancer,
}

/// A header that was read, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Who the connection is from.
    pub origin: Origin,
    /// "v1" or "v2".
    pub version: &'static str,
}

/// Why a trusted source's connection is refused before its handshake;
/// the source (a balancer) is at fault, or the client behind it closed.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    /// The first bytes are not a PROXY protocol header.
    #[error(
        "the connection does not begin with a PROXY protocol header (is the balancer sending it?)"
    )]
    Missing,
    /// It begins like one but breaks the protocol.
    #[error("malformed PROXY protocol header: {0}")]
    Malformed(String),
    /// Longer than [`MAX_HEADER`].
    #[error("PROXY protocol header longer than {MAX_HEADER} bytes")]
    TooLong,
    /// The peer closed before the header was whole.
    #[error("closed before its PROXY protocol header was complete")]
    Closed,
    /// The socket failed.
    #[error("reading the PROXY protocol header: {0}")]
    Io(#[from] std::io::Error),
}

impl HeaderError {
    /// Whether the balancer sent something wrong (worth a warning), rather
    /// than the client behind it going away.
    pub fn balancers_fault(&self) -> bool {
        matches!(self, Self::Missing | Self::Malformed(_) | Self::TooLong)
    }

    /// Metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Malformed(_) => "malformed",
            Self::TooLong => "too_long",
            Self::Closed => "closed",
            Self::Io(_) => "io_error",
        }
    }
}

/// What the bytes so far make.
#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    /// A whole header of this many bytes.
    Whole(usize, Header),
    /// Every byte so far belongs to a header that goes on.
    NeedMore,
}

/// Reads the header that begins `sock`, and nothing after it. The caller
/// bounds the wait.
pub async fn read_header(sock: &mut TcpStream) -> Result<Header, HeaderError> {
    let mut buf = vec![0u8; MAX_HEADER];
    // Bytes already taken from the socket: all of them header.
    let mut taken = 0;
    loop {
        let room = buf.get_mut(taken..).unwrap_or_default();
        if room.is_empty() {
            return Err(HeaderError::TooLong);
        }
        let n = sock.peek(room).await?;
        if n == 0 {
            return Err(HeaderError::Closed);
        }
        let seen = taken + n;
        let (upto, done) = match parse(buf.get(..seen).unwrap_or_default())? {
            Parsed::Whole(len, header) => (len, Some(header)),
            // The header goes on past these bytes: take them, so the
            // next peek waits for more instead of seeing them again.
            Parsed::NeedMore => (seen, None),
        };
        if let Some(rest) = buf.get_mut(taken..upto) {
            sock.read_exact(rest).await?;
        }
        taken = upto;
        if let Some(header) = done {
            return Ok(header);
        }
    }
}

/// Parses the start of a connection: `Ok(Some((len, header)))` for a
/// whole header of `len` bytes, `Ok(None)` while every byte so far belongs
/// to a header that goes on. The bytes after a whole header (the TLS
/// ClientHello) change nothing. Public for the fuzz targets; the server
/// reads headers with [`read_header`].
pub fn parse_header(input: &[u8]) -> Result<Option<(usize, Header)>, HeaderError> {
    Ok(match parse(input)? {
        Parsed::Whole(len, header) => Some((len, header)),
        Parsed::NeedMore => None,
    })
}

/// v2's first twelve bytes.
const V2_SIGNATURE: &[u8] = b"\r\n\r\n\0\r\nQUIT\n";
/// v1's first six.
const V1_PREFIX: &[u8] = b"PROXY ";
/// v1's longest line, CRLF included.
const V1_MAX: usize = 107;

/// Parses the start of a connection. Each version is told by its first
/// bytes, and judged whole: a v1 line once its CRLF is in, a v2 header
/// once its announced length is.
fn parse(input: &[u8]) -> Result<Parsed, HeaderError> {
    if input.starts_with(V2_SIGNATURE) || V2_SIGNATURE.starts_with(input) {
        // The length is known from the 16th byte: refuse at once what
        // would not fit, rather than after a kilobyte of it.
        if let Some(&[hi, lo]) = input.get(14..16) {
            if 16 + usize::from(u16::from_be_bytes([hi, lo])) > MAX_HEADER {
                return Err(HeaderError::TooLong);
            }
        }
        let result = v2::Header::try_from(input);
        if result.is_incomplete() {
            return Ok(Parsed::NeedMore);
        }
        let h = result.map_err(|e| HeaderError::Malformed(e.to_string()))?;
        let origin = match (h.command, h.addresses) {
            (v2::Command::Proxy, v2::Addresses::IPv4(a)) => proxied(
                (a.source_address.into(), a.source_port),
                (a.destination_address.into(), a.destination_port),
            ),
            (v2::Command::Proxy, v2::Addresses::IPv6(a)) => proxied(
                (a.source_address.into(), a.source_port),
                (a.destination_address.into(), a.destination_port),
            ),
            // LOCAL, or an address family without an IP address: the
            // protocol says to use the connection's own addresses.
            _ => Origin::Balancer,
        };
        return Ok(Parsed::Whole(
            h.len(),
            Header {
                origin,
                version: "v2",
            },
        ));
    }
    if input.starts_with(V1_PREFIX) || V1_PREFIX.starts_with(input) {
        // Only within the longest line: one longer is refused however its
        // bytes arrive, not taken when they come at once and refused when
        // the first 107 come without their CRLF.
        let window = input.get(..V1_MAX).unwrap_or(input);
        let Some(end) = window.windows(2).position(|w| w == b"\r\n") else {
            return if input.len() < V1_MAX {
                Ok(Parsed::NeedMore)
            } else {
                Err(HeaderError::Malformed(format!(
                    "a v1 line with no CRLF within {V1_MAX} bytes"
                )))
            };
        };
        let line = input.get(..end + 2).unwrap_or_default();
        let h = v1::Header::try_from(line).map_err(|e| HeaderError::Malformed(e.to_string()))?;
        let origin = match h.addresses {
            v1::Addresses::Tcp4(a) => proxied(
                (a.source_address.into(), a.source_port),
                (a.destination_address.into(), a.destination_port),
            ),
            v1::Addresses::Tcp6(a) => proxied(
                (a.source_address.into(), a.source_port),
                (a.destination_address.into(), a.destination_port),
            ),
            v1::Addresses::Unknown => Origin::Balancer,
        };
        return Ok(Parsed::Whole(
            line.len(),
            Header {
                origin,
                version: "v1",
            },
        ));
    }
    Err(HeaderError::Missing)
}

/// A client a header names, IPv4-mapped addresses as IPv4.
fn proxied(source: (IpAddr, u16), destination: (IpAddr, u16)) -> Origin {
    let canonical = |(ip, port): (IpAddr, u16)| SocketAddr::new(ip.to_canonical(), port);
    Origin::Client {
        source: canonical(source),
        destination: canonical(destination),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn v2(command: u8, family: u8, addresses: &[u8], tlvs: &[u8]) -> Vec<u8> {
        let mut h = V2_SIGNATURE.to_vec();
        h.push(0x20 | command);
        h.push(family);
        let len = u16::try_from(addresses.len() + tlvs.len()).unwrap();
        h.extend_from_slice(&len.to_be_bytes());
        h.extend_from_slice(addresses);
        h.extend_from_slice(tlvs);
        h
    }

    fn client(source: &str, destination: &str) -> Origin {
        Origin::Client {
            source: source.parse().unwrap(),
            destination: destination.parse().unwrap(),
        }
    }

    /// What `parse` must say of a whole header of `len` bytes.
    fn whole(len: usize, origin: Origin, version: &'static str) -> Parsed {
        Parsed::Whole(len, Header { origin, version })
    }

    #[test]
    fn v1_headers_name_the_client_and_their_length_excludes_what_follows() {
        let line = b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443\r\n";
        let mut input = line.to_vec();
        input.extend_from_slice(b"\x16\x03\x01\x02\x00");
        assert_eq!(
            parse(&input).unwrap(),
            whole(
                line.len(),
                client("192.0.2.7:56324", "198.51.100.1:443"),
                "v1"
            )
        );
        let line = b"PROXY TCP6 2001:db8::7 2001:db8::1 56324 443\r\n";
        assert_eq!(
            parse(line).unwrap(),
            whole(
                line.len(),
                client("[2001:db8::7]:56324", "[2001:db8::1]:443"),
                "v1"
            )
        );
        // An IPv4 client behind a dual-stack balancer is an IPv4 client.
        let line = b"PROXY TCP6 ::ffff:192.0.2.9 2001:db8::1 56324 443\r\n";
        assert_eq!(
            parse(line).unwrap(),
            whole(
                line.len(),
                client("192.0.2.9:56324", "[2001:db8::1]:443"),
                "v1"
            )
        );
        assert_eq!(
            parse(b"PROXY UNKNOWN\r\n").unwrap(),
            whole(15, Origin::Balancer, "v1")
        );
    }

    #[test]
    fn v2_headers_with_tlvs_name_the_client_and_local_means_the_balancer() {
        let addrs = [192, 0, 2, 7, 198, 51, 100, 1, 0xdc, 0x04, 0x01, 0xbb];
        // A TLV as AWS's balancer adds (type 0xEA, a VPC endpoint id).
        let tlv = [0xea, 0, 4, 1, b'v', b'p', b'c'];
        let h = v2(1, 0x11, &addrs, &tlv);
        let mut input = h.clone();
        input.extend_from_slice(b"\x16\x03\x01");
        assert_eq!(
            parse(&input).unwrap(),
            whole(h.len(), client("192.0.2.7:56324", "198.51.100.1:443"), "v2")
        );
        let mut addrs6 = Vec::new();
        addrs6.extend_from_slice(
            &"2001:db8::7"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        addrs6.extend_from_slice(&[0; 16]);
        addrs6.extend_from_slice(&[0xdc, 0x04, 0x01, 0xbb]);
        let h = v2(1, 0x21, &addrs6, &[]);
        assert_eq!(
            parse(&h).unwrap(),
            whole(h.len(), client("[2001:db8::7]:56324", "[::]:443"), "v2")
        );
        // LOCAL ignores whatever addresses it carries.
        let h = v2(0, 0x11, &addrs, &[]);
        assert_eq!(parse(&h).unwrap(), whole(h.len(), Origin::Balancer, "v2"));
    }

    #[test]
    fn every_proper_prefix_of_a_header_asks_for_more() {
        let v1 = b"PROXY TCP4 192.0.2.7 198.51.100.1 56324 443\r\n".to_vec();
        let addrs = [192, 0, 2, 7, 198, 51, 100, 1, 0xdc, 0x04, 0x01, 0xbb];
        for h in [v1, v2(1, 0x11, &addrs, &[1, 0, 1, 0])] {
            for cut in 1..h.len() {
                assert_eq!(
                    parse(&h[..cut]).unwrap(),
                    Parsed::NeedMore,
                    "{:?}",
                    &h[..cut]
                );
            }
        }
    }

    #[test]
    fn a_tls_client_hello_or_garbage_is_a_missing_header_and_broken_ones_are_malformed() {
        let hello = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03";
        assert!(matches!(parse(hello), Err(HeaderError::Missing)));
        assert!(matches!(
            parse(b"GET / HTTP/1.1\r\n"),
            Err(HeaderError::Missing)
        ));
        assert!(matches!(parse(&[b'A'; 200]), Err(HeaderError::Missing)));
        for bad in [
            &b"PROXY TCP4 300.0.2.7 198.51.100.1 56324 443\r\n"[..],
            b"PROXY TCP5 192.0.2.7 198.51.100.1 56324 443\r\n",
            b"PROXY TCP4 192.0.2.7 198.51.100.1 99999 443\r\n",
        ] {
            assert!(
                matches!(parse(bad), Err(HeaderError::Malformed(_))),
                "{bad:?}"
            );
        }
        // A v1 line that never ends.
        let mut endless = b"PROXY TCP4 ".to_vec();
        endless.resize(200, b'1');
        assert!(matches!(parse(&endless), Err(HeaderError::Malformed(_))));
        // One that ends past 107 bytes is refused whole as in pieces
        // (UNKNOWN takes anything up to its CRLF; the fuzz target found it
        // taken whole and refused when its first 107 bytes came alone).
        let mut long = b"PROXY UNKNOWN ".to_vec();
        long.resize(130, b'x');
        long.extend_from_slice(b"\r\n");
        assert!(matches!(parse(&long), Err(HeaderError::Malformed(_))));
        assert!(matches!(
            parse(&long[..107]),
            Err(HeaderError::Malformed(_))
        ));
        let mut longest = b"PROXY UNKNOWN ".to_vec();
        longest.resize(105, b'x');
        longest.extend_from_slice(b"\r\n");
        assert_eq!(parse(&longest).unwrap(), whole(107, Origin::Balancer, "v1"));
        // v2 with version 1, and with too few bytes for its addresses.
        let mut wrong_version = v2(1, 0x11, &[0; 12], &[]);
        wrong_version[12] = 0x11;
        assert!(matches!(
            parse(&wrong_version),
            Err(HeaderError::Malformed(_))
        ));
        assert!(matches!(
            parse(&v2(1, 0x11, &[0; 4], &[])),
            Err(HeaderError::Malformed(_))
        ));
        // Announcing more than the server takes is refused on its 16th byte.
        let mut huge = V2_SIGNATURE.to_vec();
        huge.extend_from_slice(&[0x21, 0x11, 0x03, 0xf1]);
        assert!(matches!(parse(&huge), Err(HeaderError::TooLong)));
        huge[15] = 0xf0;
        assert_eq!(parse(&huge).unwrap(), Parsed::NeedMore);
    }

    #[test]
    fn hostile_bytes_never_panic() {
        // A cheap fuzz: random bytes, and random bytes after each
        // signature, at every length.
        let mut rng = fastrand::Rng::with_seed(7);
        for _ in 0..20_000 {
            let len = rng.usize(0..300);
            let mut input: Vec<u8> = match rng.u8(0..3) {
                0 => V2_SIGNATURE.to_vec(),
                1 => b"PROXY ".to_vec(),
                _ => Vec::new(),
            };
            input.extend((0..len).map(|_| rng.u8(..)));
            let _ = parse(&input);
        }
    }
}
