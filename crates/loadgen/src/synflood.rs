//! A SYN flood generator: TCP SYNs from spoofed source addresses (a range
//! the caller gives), built as whole Ethernet frames and sent through an
//! `AF_PACKET` socket past the qdisc, in batches (`sendmmsg`), at a set
//! rate or as fast as one core goes, bounded in count and time.
//!
//! It exists for tlsgate's XDP tests and bench, which aim it only at
//! network namespaces they create (the spoofed range routed inside them);
//! it sends on the interface it is given and nowhere else. It does not
//! receive: the SYN-ACKs go to addresses that do not exist.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tlsgate_sys::packet::{ifindex, PacketSocket};

/// Spoofed sources: `count` consecutive addresses from `first`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sources {
    /// The first address (same family as the target).
    pub first: IpAddr,
    /// How many addresses, at least 1.
    pub count: u32,
}

/// What to send.
#[derive(Clone, Debug)]
pub struct SynFlood {
    /// The interface to send on (in the generator thread's namespace).
    pub iface: String,
    /// Source MAC of the frames.
    pub src_mac: [u8; 6],
    /// Destination MAC: the target's interface (or the next hop).
    pub dst_mac: [u8; 6],
    /// Target address and port.
    pub target: SocketAddr,
    /// Spoofed source addresses, cycled through.
    pub sources: Sources,
    /// SYNs per second; `None`: as fast as possible.
    pub rate: Option<u64>,
    /// Stop after this many SYNs.
    pub count: Option<u64>,
    /// Stop after this long in any case.
    pub duration: Duration,
    /// The options a Linux client sends (MSS, SACK permitted, timestamps,
    /// window scale: 20 bytes) instead of none.
    pub options: bool,
    /// Frames per `sendmmsg` (per `BPF_PROG_RUN` batch with
    /// [`Inject::XdpLive`]).
    pub batch: usize,
    /// How the frames are sent.
    pub inject: Inject,
    /// [`Inject::XdpLive`]: an interface without traffic (in the
    /// generator's namespace) to attach the generator's XDP program to, so
    /// that each `BPF_PROG_RUN` call is cheap and the flood can be paced.
    pub xdp_anchor: Option<String>,
}

/// How the generator puts its frames on the interface.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Inject {
    /// `AF_PACKET` past the qdisc, `sendmmsg`: the receiver gets skbs
    /// with little headroom; veth copies each into a fresh page before it
    /// runs an XDP program on it.
    #[default]
    Packet,
    /// An XDP program run with `BPF_PROG_RUN` in live-frame mode that
    /// rewrites a template SYN per frame and transmits it with `XDP_TX`
    /// (IPv4 only; paced only with [`SynFlood::xdp_anchor`]): on veth the peer gets `xdp_frame`s
    /// with XDP headroom, as a NIC driver hands frames to XDP, and the
    /// sender builds no skb. Needs Linux 5.18+.
    XdpLive,
}

/// What was sent.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FloodReport {
    /// SYNs sent.
    pub sent: u64,
    /// From the first send to the last.
    pub elapsed: Duration,
    /// [`Inject::XdpLive`]: calls the kernel refused (`ENOSPC`), their
    /// frames not sent.
    pub refused_calls: u64,
}

impl FloodReport {
    /// SYNs per second.
    pub fn rate(&self) -> f64 {
        self.sent as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// The one's-complement sum of `data` (big-endian 16-bit words) added to
/// `sum`, not folded.
fn sum16(data: &[u8], mut sum: u32) -> u32 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        sum += u32::from(u16::from_be_bytes([c[0], c[1]]));
    }
    if let [b] = chunks.remainder() {
        sum += u32::from(*b) << 8;
    }
    sum
}

fn fold(mut sum: u32) -> u16 {
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The i-th source address of the range.
fn source(s: &Sources, i: u64) -> IpAddr {
    let k = (i % u64::from(s.count.max(1))) as u32;
    match s.first {
        IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a).wrapping_add(k))),
        IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a).wrapping_add(u128::from(k)))),
    }
}

/// Builds the i-th SYN of `spec` into `frame` (cleared first): Ethernet,
/// IPv4 or IPv6, TCP with a source port and sequence number that vary
/// with `i`, checksums filled in.
pub fn build_syn(spec: &SynFlood, i: u64, frame: &mut Vec<u8>) {
    frame.clear();
    let src = source(&spec.sources, i);
    frame.extend_from_slice(&spec.dst_mac);
    frame.extend_from_slice(&spec.src_mac);
    let v6 = spec.target.is_ipv6();
    frame.extend_from_slice(&(if v6 { 0x86ddu16 } else { 0x0800 }).to_be_bytes());
    let opts: &[u8] = if spec.options {
        // MSS 1460, SACK permitted, timestamps, NOP, window scale 7.
        &[
            2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 0, 0, 0, 0, 0, 1, 3, 3, 7,
        ]
    } else {
        &[]
    };
    let tcp_len = 20 + opts.len();
    let l3 = frame.len();
    let mut pseudo;
    match (src, spec.target.ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let total = (20 + tcp_len) as u16;
            frame.extend_from_slice(&[0x45, 0]);
            frame.extend_from_slice(&total.to_be_bytes());
            frame.extend_from_slice(&(i as u16).to_be_bytes());
            frame.extend_from_slice(&[0x40, 0, 64, 6, 0, 0]);
            frame.extend_from_slice(&s.octets());
            frame.extend_from_slice(&d.octets());
            let c = fold(sum16(&frame[l3..l3 + 20], 0));
            frame[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
            pseudo = sum16(&s.octets(), 0);
            pseudo = sum16(&d.octets(), pseudo);
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            frame.extend_from_slice(&[0x60, 0, 0, 0]);
            frame.extend_from_slice(&(tcp_len as u16).to_be_bytes());
            frame.extend_from_slice(&[6, 64]);
            frame.extend_from_slice(&s.octets());
            frame.extend_from_slice(&d.octets());
            pseudo = sum16(&s.octets(), 0);
            pseudo = sum16(&d.octets(), pseudo);
        }
        // The caller's families differ: SynFlood::check refuses that.
        _ => return,
    }
    pseudo += 6 + tcp_len as u32;
    let l4 = frame.len();
    let sport = 1024 + (i.wrapping_mul(7919) % 64_000) as u16;
    let seq = (i as u32).wrapping_mul(2_654_435_761);
    frame.extend_from_slice(&sport.to_be_bytes());
    frame.extend_from_slice(&spec.target.port().to_be_bytes());
    frame.extend_from_slice(&seq.to_be_bytes());
    frame.extend_from_slice(&[0, 0, 0, 0]);
    frame.push(((tcp_len / 4) as u8) << 4);
    frame.push(0x02); // SYN
    frame.extend_from_slice(&64240u16.to_be_bytes());
    frame.extend_from_slice(&[0, 0, 0, 0]);
    frame.extend_from_slice(opts);
    if spec.options {
        // TSval: varies, like a clock.
        frame[l4 + 28..l4 + 32].copy_from_slice(&(i as u32).to_be_bytes());
    }
    let c = fold(sum16(&frame[l4..], pseudo));
    frame[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
}

impl SynFlood {
    fn check(&self) -> io::Result<()> {
        let bad = |m: &str| Err(io::Error::new(io::ErrorKind::InvalidInput, m.to_string()));
        if self.sources.first.is_ipv6() != self.target.is_ipv6() {
            return bad("sources and target must be of one address family");
        }
        if self.sources.count == 0 || self.batch == 0 {
            return bad("sources.count and batch must be at least 1");
        }
        if self.count.is_none() && self.duration.is_zero() {
            return bad("a flood needs a count or a duration");
        }
        Ok(())
    }

    /// Sends until `count`, `duration` or `stop`, whichever comes first.
    pub fn run(&self, stop: &AtomicBool) -> io::Result<FloodReport> {
        self.check()?;
        if self.inject == Inject::XdpLive {
            return self.run_xdp(stop);
        }
        let sock = PacketSocket::open(ifindex(&self.iface)?)?;
        let mut frames: Vec<Vec<u8>> = vec![Vec::with_capacity(128); self.batch];
        self.paced(self.batch, stop, |sent, n| {
            for (k, f) in frames.iter_mut().take(n).enumerate() {
                build_syn(self, sent + k as u64, f);
            }
            let refs: Vec<&[u8]> = frames.iter().take(n).map(Vec::as_slice).collect();
            match sock.send_batch(&refs) {
                Ok(k) => Ok(k),
                // The device queue is full: try again.
                Err(e)
                    if e.kind() == io::ErrorKind::WouldBlock
                        || e.raw_os_error() == Some(rustix::io::Errno::NOBUFS.raw_os_error()) =>
                {
                    std::thread::yield_now();
                    Ok(0)
                }
                Err(e) => Err(io::Error::new(
                    e.kind(),
                    format!("sendmmsg on {}: {e}", self.iface),
                )),
            }
        })
    }

    /// The send loop: `send(sent so far, n)` sends up to `n` (at most
    /// `batch`) SYNs and says how many went; batches are paced to `rate`
    /// when there is one.
    fn paced(
        &self,
        batch: usize,
        stop: &AtomicBool,
        mut send: impl FnMut(u64, usize) -> io::Result<usize>,
    ) -> io::Result<FloodReport> {
        let start = Instant::now();
        let deadline = start + self.duration;
        let limit = self.count.unwrap_or(u64::MAX);
        let mut sent = 0u64;
        while sent < limit && !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            if let Some(rate) = self.rate {
                // The next batch is due when the ones sent so far have had
                // their share of time.
                let due = start + Duration::from_secs_f64(sent as f64 / rate.max(1) as f64);
                if due > now {
                    let wait = due - now;
                    if wait > Duration::from_micros(100) {
                        std::thread::sleep(wait);
                    } else {
                        std::hint::spin_loop();
                    }
                    continue;
                }
            }
            let n = (limit - sent).min(batch as u64) as usize;
            sent += send(sent, n)? as u64;
        }
        Ok(FloodReport {
            sent,
            elapsed: start.elapsed(),
            refused_calls: 0,
        })
    }

    /// [`Inject::XdpLive`]: `BPF_PROG_RUN` on a template. Paced in
    /// batches when the program has an anchor interface
    /// ([`SynFlood::xdp_anchor`]); without one every call costs tens of
    /// milliseconds (~25 ms on the 6.18 developer VM, whatever the frame
    /// count), so calls are big, a paced flood would come in bursts, and
    /// only flat out is allowed.
    fn run_xdp(&self, stop: &AtomicBool) -> io::Result<FloodReport> {
        let other = |m: String| io::Error::other(m);
        let IpAddr::V4(first) = self.sources.first else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the XDP injection mode sends IPv4 SYNs only",
            ));
        };
        if self.rate.is_some() && self.xdp_anchor.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the XDP injection mode paces only with an anchor interface (xdp_anchor)",
            ));
        }
        let ifindex = ifindex(&self.iface)?;
        let mut prog = tlsgate_xdp::flood::FloodProgram::load(first, self.sources.count, 0)
            .map_err(|e| other(e.to_string()))?;
        if let Some(anchor) = &self.xdp_anchor {
            prog.anchor(anchor).map_err(|e| other(e.to_string()))?;
        }
        let fd = prog.fd().map_err(|e| other(e.to_string()))?;
        let mut template = Vec::with_capacity(128);
        build_syn(self, 0, &mut template);
        let batch = self.batch.clamp(1, 256);
        // Frames per call. Thousands of calls a second make the kernel
        // refuse calls (ENOSPC) after a few hundred thousand frames; likely
        // (not proven) because each call registers a page pool under an XDP
        // memory-model id (65,534 in all) freed only when every frame it
        // sent has come back, a second or more later. So at most ~1,000
        // calls a second (1 ms of frames each when paced),
        // and flat out big calls (~15 ms each at a million frames/s;
        // without an anchor each call also costs ~25 ms of set-up).
        let chunk = match (self.rate, &self.xdp_anchor) {
            (Some(rate), Some(_)) => (rate as usize / 1_000).max(batch),
            _ => 1 << 14,
        };
        // Calls refused with ENOSPC (out of memory model ids, above) send
        // nothing; refused for two seconds in a row is an error.
        let mut refused_since: Option<Instant> = None;
        let mut refused = 0u64;
        let mut report = self.paced(
            chunk,
            stop,
            |sent, n| match tlsgate_sys::packet::xdp_live_run(
                fd,
                &template,
                ifindex,
                n as u32,
                batch as u32,
            ) {
                Ok(()) => {
                    refused_since = None;
                    Ok(n)
                }
                Err(e)
                    if e.kind() == io::ErrorKind::StorageFull
                        && refused_since.is_none_or(|t| t.elapsed() < Duration::from_secs(2)) =>
                {
                    refused_since.get_or_insert_with(Instant::now);
                    refused += 1;
                    std::thread::sleep(Duration::from_micros(200));
                    Ok(0)
                }
                Err(e) => Err(io::Error::new(
                    e.kind(),
                    format!(
                        "{e} on {} ({n} frames, {sent} sent before, {refused} calls refused)",
                        self.iface
                    ),
                )),
            },
        )?;
        report.refused_calls = refused;
        Ok(report)
    }

    /// Runs the flood on a thread of its own, moved first into the network
    /// namespace at `netns` (e.g. `/run/netns/NAME`) and pinned to `core`
    /// when given.
    pub fn spawn(
        self,
        netns: Option<PathBuf>,
        core: Option<usize>,
        stop: Arc<AtomicBool>,
    ) -> io::Result<JoinHandle<io::Result<FloodReport>>> {
        std::thread::Builder::new()
            .name("synflood".into())
            .spawn(move || {
                if let Some(core) = core {
                    core_affinity::set_for_current(core_affinity::CoreId { id: core });
                }
                if let Some(ns) = netns {
                    let f = std::fs::File::open(&ns)
                        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", ns.display())))?;
                    rustix::thread::move_into_link_name_space(
                        std::os::fd::AsFd::as_fd(&f),
                        Some(rustix::thread::LinkNameSpaceType::Network),
                    )
                    .map_err(|e| {
                        io::Error::new(
                            io::Error::from(e).kind(),
                            format!("setns {}: {e}", ns.display()),
                        )
                    })?;
                }
                self.run(&stop)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(target: &str, first: &str, options: bool) -> SynFlood {
        SynFlood {
            iface: "lo".into(),
            src_mac: [2, 0, 0, 0, 0, 1],
            dst_mac: [2, 0, 0, 0, 0, 2],
            target: target.parse().unwrap_or_else(|_| unreachable!()),
            sources: Sources {
                first: first.parse().unwrap_or_else(|_| unreachable!()),
                count: 4,
            },
            rate: None,
            count: Some(10),
            duration: Duration::from_secs(1),
            options,
            batch: 8,
            inject: Inject::Packet,
            xdp_anchor: None,
        }
    }

    /// Every checksum sums to zero over what it covers.
    #[test]
    fn ipv4_syns_are_well_formed_and_cycle_through_the_sources() {
        let s = spec("10.254.1.1:8443", "10.254.2.250", true);
        let mut f = Vec::new();
        for i in 0..6u64 {
            build_syn(&s, i, &mut f);
            assert_eq!(f.len(), 14 + 20 + 40);
            assert_eq!(&f[12..14], &[0x08, 0x00]);
            assert_eq!(fold(sum16(&f[14..34], 0)), 0, "IPv4 header checksum");
            let src = [250u8, 251, 252, 253][(i % 4) as usize];
            assert_eq!(&f[26..30], &[10, 254, 2, src]);
            let mut pseudo = sum16(&f[26..34], 0);
            pseudo += 6 + 40;
            assert_eq!(fold(sum16(&f[34..], pseudo)), 0, "TCP checksum");
            assert_eq!(u16::from_be_bytes([f[36], f[37]]), 8443);
            assert_eq!(f[34 + 12], 10 << 4);
            assert_eq!(f[34 + 13], 0x02);
        }
        let s = spec("10.254.1.1:8443", "10.254.2.1", false);
        build_syn(&s, 0, &mut f);
        assert_eq!(f.len(), 14 + 20 + 20);
    }

    #[test]
    fn ipv6_syns_are_well_formed() {
        let s = spec("[fd00:254:1::1]:443", "fd00:254:2::ffff", false);
        let mut f = Vec::new();
        build_syn(&s, 1, &mut f);
        assert_eq!(f.len(), 14 + 40 + 20);
        assert_eq!(&f[12..14], &[0x86, 0xdd]);
        assert_eq!(f[14 + 6], 6);
        assert_eq!(&f[22 + 12..22 + 16], &[0, 1, 0, 0], "fd00:254:2::ffff + 1");
        let mut pseudo = sum16(&f[22..54], 0);
        pseudo += 6 + 20;
        assert_eq!(fold(sum16(&f[54..], pseudo)), 0, "TCP checksum");
    }

    /// XDP injection: IPv4 only, paced only with an anchor, refused before
    /// any BPF.
    #[test]
    fn xdp_injection_refuses_ipv6_and_unanchored_pacing() {
        let stop = AtomicBool::new(false);
        let mut s = spec("10.254.1.1:8443", "10.254.2.1", true);
        s.inject = Inject::XdpLive;
        s.rate = Some(1000);
        let e = s.run(&stop).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        let mut s = spec("[fd00:254:1::1]:443", "fd00:254:2::1", false);
        s.inject = Inject::XdpLive;
        let e = s.run(&stop).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }

    #[test]
    fn mixed_families_and_unbounded_floods_are_refused() {
        let mut s = spec("10.254.1.1:8443", "fd00::1", false);
        assert!(s.check().is_err());
        s = spec("10.254.1.1:8443", "10.254.2.1", false);
        s.count = None;
        s.duration = Duration::ZERO;
        assert!(s.check().is_err());
    }
}
