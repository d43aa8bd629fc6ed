/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The layout shared by the XDP program (syngate.bpf.c) and tlsgate's
 * loader (crates/xdp/src/abi.rs mirrors every struct here byte for byte and
 * its unit tests pin the sizes and offsets). Change both together.
 */
#ifndef TLSGATE_SYNGATE_H
#define TLSGATE_SYNGATE_H

#include <linux/types.h>

/* Protected ports per interface: slots 0..SG_MAX_PORTS-1. */
#define SG_MAX_PORTS 16

/* Modes (struct sg_config.mode). */
#define SG_MODE_OFF 0
#define SG_MODE_ALWAYS 1
#define SG_MODE_AUTO 2

/* The one entry of the "config" array, written by user space. */
struct sg_config {
	__u32 mode;
	/* The receive window scale the kernel will pick for a cookie socket
	 * (tcp_select_initial_window); advertised in our SYN-ACKs. */
	__u32 wscale;
	/* auto: in peacetime, try a cookie for one SYN per t1 ... */
	__u64 t1_ns;
	/* ... and after a cookie was issued, for every SYN until t2 passes
	 * without one. */
	__u64 t2_ns;
	/* Top sources: a SYN answered in flood mode is counted when
	 * (random & top_sample_mask) == 0; 0 counts every one. */
	__u32 top_sample_mask;
	/* Our MSS, advertised in SYN-ACKs (RFC 9293 3.7.1: the largest
	 * segment we can receive): the interface's MTU less 40 (IPv4) or 60
	 * (IPv6) bytes of headers, as the kernel's own advmss. */
	__u16 mss4;
	__u16 mss6;
	/* For user space only (the program ignores them), so that the pinned
	 * map describes the attachment by itself: the port of each slot
	 * (0 = unused), and the sysctl values found before attach changed
	 * them (-1 = not changed), restored by detach. */
	__u16 slot_ports[SG_MAX_PORTS];
	__s32 saved_syncookies;
	__s32 saved_timestamps;
	/* The interface's MAC address: only frames sent to it are answered. */
	__u8 if_mac[6];
	/* SG_F_*: the TCP options the host allows (its sysctls); the kernel
	 * refuses a cookie ACK that claims one it does not. */
	__u16 flags;
};

/* struct sg_config.flags */
#define SG_F_SACK 1   /* net.ipv4.tcp_sack */
#define SG_F_WSCALE 2 /* net.ipv4.tcp_window_scaling */

/* Per port slot and per CPU ("counters", a per-CPU array of these).
 * Every SYN seen is either answered (cookies) or passed:
 * syn_seen == cookies + passed. no_listener, errors, martian and
 * malformed are the passed SYNs that were not answered, by reason (a
 * subset of passed). */
struct sg_counters {
	__u64 syn_seen;
	__u64 cookies;
	__u64 passed;
	__u64 no_listener;
	__u64 errors;
	__u64 sampled; /* auto: peacetime probes (SYNs tried while not in flood) */
	__u64 martian;   /* an address the kernel drops (see martian4/6) */
	__u64 malformed; /* IP length short of the TCP header, or past the frame */
};

/* Per port slot, shared by all CPUs ("state", an array). Written without
 * locks: concurrent SYNs on several CPUs may both see a transition, so
 * the transition counts are exact only to within the number of CPUs. */
struct sg_state {
	__u64 last_try_ns;    /* auto: last peacetime probe */
	__u64 last_cookie_ns; /* last cookie issued (CLOCK_MONOTONIC) */
	__u64 flood_entered;  /* transitions peace -> flood */
	__u64 flood_left;     /* transitions flood -> peace */
	__u32 flood;          /* 1 while in flood mode */
	__u32 pad;
};

/* Sizes that abi.rs asserts too. */
_Static_assert(sizeof(struct sg_config) == 80, "sg_config layout");
_Static_assert(sizeof(struct sg_counters) == 64, "sg_counters layout");
_Static_assert(sizeof(struct sg_state) == 40, "sg_state layout");

#endif
