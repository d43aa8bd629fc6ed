//! The SYN flood generator's XDP program (`bpf/flood.bpf.c`), for
//! tlsgate-loadgen's `synflood` in its XDP mode: loaded but never
//! attached, run with `BPF_PROG_RUN` in live-frame mode
//! (`tlsgate_sys::packet::xdp_live_run`) on an IPv4 SYN template, it
//! varies each SYN's source address, port, sequence number and TSval and
//! transmits it with `XDP_TX`. On a veth pair the SYNs then reach the peer
//! as `xdp_frame`s with XDP headroom, as a NIC driver hands frames to XDP,
//! rather than as `AF_PACKET` skbs, which veth copies into a fresh page
//! before it runs XDP on them.

use std::net::Ipv4Addr;
use std::os::fd::{AsFd, BorrowedFd};

use aya::maps::{Array, MapData};
use aya::programs::{ProgramError, Xdp, XdpFlags};
use aya::EbpfLoader;

use crate::gate::chain;
use crate::Error;

/// The compiled object.
static FLOOD_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/flood.bpf.o"));

/// The loaded program and its state.
#[derive(Debug)]
pub struct FloodProgram {
    ebpf: aya::Ebpf,
}

impl FloodProgram {
    /// Loads the program; its SYNs come from `count` consecutive source
    /// addresses from `first` and start at index `next`.
    pub fn load(first: Ipv4Addr, count: u32, next: u64) -> Result<FloodProgram, Error> {
        if count == 0 {
            return Err(Error::Invalid("a flood needs at least one source".into()));
        }
        let mut ebpf = EbpfLoader::new()
            .load(FLOOD_OBJECT)
            .map_err(|e| Error::bpf("load the flood object", chain(&e)))?;
        let prog: &mut Xdp = ebpf
            .program_mut("synflood_tx")
            .ok_or_else(|| Error::bpf("find program synflood_tx", "not in the object"))?
            .try_into()
            .map_err(|e: ProgramError| Error::bpf("program synflood_tx", chain(&e)))?;
        prog.load()
            .map_err(|e| Error::bpf("load program synflood_tx", chain(&e)))?;
        let map = ebpf
            .map_mut("flood_state")
            .ok_or_else(|| Error::bpf("find map flood_state", "not in the object"))?;
        let mut state: Array<&mut MapData, [u8; 16]> =
            Array::try_from(map).map_err(|e| Error::bpf("map flood_state", chain(&e)))?;
        // struct flood_state: next (u64), src_first (u32, host order),
        // src_count (u32), native byte order.
        let mut v = [0u8; 16];
        v[..8].copy_from_slice(&next.to_ne_bytes());
        v[8..12].copy_from_slice(&u32::from(first).to_ne_bytes());
        v[12..].copy_from_slice(&count.to_ne_bytes());
        state
            .set(0, v, 0)
            .map_err(|e| Error::bpf("write flood_state", chain(&e)))?;
        Ok(FloodProgram { ebpf })
    }

    /// Attaches the program in generic (skb) mode to `iface`, an interface
    /// that carries no traffic (e.g. one end of an idle veth pair), until
    /// this value is dropped. `BPF_PROG_RUN` with more than one frame adds
    /// the program to the kernel's XDP dispatcher and removes it again, and
    /// each of those changes waits for an RCU grace period (~25 ms per call
    /// on the developer VM); a program that is attached somewhere is in
    /// the dispatcher already, so calls cost tens of microseconds and a
    /// flood can be paced in small batches.
    pub fn anchor(&mut self, iface: &str) -> Result<(), Error> {
        let prog: &mut Xdp = self
            .ebpf
            .program_mut("synflood_tx")
            .ok_or_else(|| Error::bpf("find program synflood_tx", "not in the object"))?
            .try_into()
            .map_err(|e: ProgramError| Error::bpf("program synflood_tx", chain(&e)))?;
        // The link belongs to the program, which detaches it when dropped.
        prog.attach(iface, XdpFlags::SKB_MODE)
            .map_err(|e| Error::bpf(format!("attach synflood_tx to {iface}"), chain(&e)))?;
        Ok(())
    }

    /// The program's descriptor, for `BPF_PROG_RUN`.
    pub fn fd(&self) -> Result<BorrowedFd<'_>, Error> {
        let prog: &Xdp = self
            .ebpf
            .program("synflood_tx")
            .ok_or_else(|| Error::bpf("find program synflood_tx", "not in the object"))?
            .try_into()
            .map_err(|e: ProgramError| Error::bpf("program synflood_tx", chain(&e)))?;
        Ok(prog
            .fd()
            .map_err(|e| Error::bpf("program synflood_tx", chain(&e)))?
            .as_fd())
    }
}
