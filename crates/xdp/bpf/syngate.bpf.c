// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * SynGate: SYN cookies issued at the driver for a local listener.
 *
 * A SYN to a protected port is answered from XDP with a SYN-ACK whose
 * sequence number is a cookie made by the kernel's own helper
 * (bpf_tcp_gen_syncookie): it uses the kernel's cookie secret and marks the
 * listener as recently overflowed, so the kernel's cookie check accepts the
 * final ACK and creates the socket. Nothing here checks ACKs.
 *
 * Depends on (see shared field notes, verified on the 6.18 kernel):
 *  - net.ipv4.tcp_syncookies=2 for mode "always" (with 1 the helper answers
 *    -ENOENT unless the listener's SYN queue is full, which is what "auto"
 *    uses to detect a flood);
 *  - net.ipv4.tcp_timestamps=2: the kernel subtracts a per-connection
 *    offset from TSecr before decoding the options we encode in TSval,
 *    an offset BPF cannot compute; with 2 there is none.
 *
 * Everything that is not a SYN to a protected port, and every SYN that
 * cannot be answered here (IPv4 options, IPv6 extension headers, no
 * listener, helper errors), passes to the kernel untouched. So do SYNs the
 * kernel would drop, for it to count and drop: from or to an address it
 * never answers (martian4/6), or whose IP length does not hold the TCP
 * header or is not all in the frame (the options would be read from
 * Ethernet padding). Nothing is dropped here.
 *
 * Only frames sent to the interface's own MAC address are answered; the
 * rest (other hosts' frames seen on a shared segment or in promiscuous
 * mode, broadcast, multicast) pass, and the kernel drops the TCP among
 * them. The MAC, not the IP address, because the listener lookup cannot
 * tell: a listener bound to a wildcard address matches any destination, and
 * XDP has no cheap test of "a local address" (bpf_fib_lookup refuses on
 * interfaces that do not forward). So a host that routes traffic for a
 * protected port to other hosts (frames to its MAC, foreign addresses) must
 * bind its listeners to its own addresses.
 *
 * Not checked here: the SYN's checksum (a corrupt SYN gets a SYN-ACK; its
 * ACK, if any, meets the kernel's checks).
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "syngate.h"

#ifndef ENOENT
#define ENOENT 2
#endif

/* TCP header of our SYN-ACK: 20 bytes + 20 bytes of options. */
#define SYNACK_TCP_LEN 40
/* The window of the SYN-ACK (never scaled): 44 segments of 1460, what
 * Linux itself advertises for a 1500-byte MTU. Non-zero matters: the
 * client may not send before the first window update otherwise. */
#define SYNACK_WINDOW 64240
#define TS_OPT_WSCALE_NONE 0xf
#define TS_OPT_SACK (1u << 4)
#define TSBITS 6

/* TCP option kinds and lengths (RFC 9293, 7323, 2018). */
#define TCPOPT_EOL 0
#define TCPOPT_NOP 1
#define TCPOPT_MAXSEG 2
#define TCPOPT_WINDOW 3
#define TCPOPT_SACK_PERM 4
#define TCPOPT_TIMESTAMP 8
#define TCPOLEN_MAXSEG 4
#define TCPOLEN_WINDOW 3
#define TCPOLEN_SACK_PERM 2
#define TCPOLEN_TIMESTAMP 10

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct sg_config);
} config SEC(".maps");

/* Destination port (host order) -> slot + 1; 0 = not protected. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u32);
} ports SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SG_MAX_PORTS);
	__type(key, __u32);
	__type(value, struct sg_counters);
} counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SG_MAX_PORTS);
	__type(key, __u32);
	__type(value, struct sg_state);
} state SEC(".maps");

/* Sources of SYNs answered in flood mode, sampled: IPv4 /32 (network
 * order) and IPv6 /64 (the first 8 address bytes as stored). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u64);
} top_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64);
	__type(value, __u64);
} top_v6 SEC(".maps");

/* What the SYN said, read before the packet is rewritten. */
struct syn_info {
	__u32 tsval;   /* the client's TSval, our TSecr */
	__u8 has_ts;
	__u8 has_ws;
	__u8 ws;       /* the client's window scale */
	__u8 sack;
};

static __always_inline __u16 csum_fold(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)~sum;
}

/* The TCP header as the helper wants it: a copy on the stack, so that its
 * length (20..60, from doff) can vary without a packet-range proof for
 * the longest one. */
struct tcp_copy {
	__u8 b[64];
};

/* Byte k of the copy. The mask keeps every index provably inside it; the
 * empty asm stops clang from dropping the mask as redundant with the loop's
 * own checks, which the verifier does not always connect to the index. */
static __always_inline __u8 tcb(const struct tcp_copy *tc, __u32 k)
{
	asm volatile("" : "+r"(k));
	return tc->b[k & 63];
}

/* One TCP option of the SYN at offset i of the options: records it in si
 * and returns the offset of the next one, or 64 to stop. A global
 * function, so the verifier checks it once, on its own: inlined in the
 * loop below, every option kind multiplied the paths of every iteration
 * past the verifier's limit. */
__noinline int option_step(const struct tcp_copy *tc, __u32 i, __u32 optlen, struct syn_info *si)
{
	__u8 kind, len;

	if (!tc || !si || i >= optlen || i >= 40)
		return 64;
	kind = tcb(tc, 20 + i);
	if (kind == TCPOPT_EOL)
		return 64;
	if (kind == TCPOPT_NOP)
		return i + 1;
	if (i + 2 > optlen)
		return 64;
	len = tcb(tc, 20 + i + 1);
	if (len < 2 || i + len > optlen)
		return 64;
	if (kind == TCPOPT_WINDOW && len == TCPOLEN_WINDOW) {
		__u8 ws = tcb(tc, 20 + i + 2);

		si->has_ws = 1;
		si->ws = ws > 14 ? 14 : ws;
	} else if (kind == TCPOPT_SACK_PERM && len == TCPOLEN_SACK_PERM) {
		si->sack = 1;
	} else if (kind == TCPOPT_TIMESTAMP && len == TCPOLEN_TIMESTAMP) {
		si->has_ts = 1;
		si->tsval = ((__u32)tcb(tc, 20 + i + 2) << 24) | ((__u32)tcb(tc, 20 + i + 3) << 16) |
			    ((__u32)tcb(tc, 20 + i + 4) << 8) | tcb(tc, 20 + i + 5);
	}
	return i + len;
}

/* TCP options of the SYN, from the copy of its header (thlen bytes):
 * at most 40 option bytes, so at most 40 steps. */
__noinline int parse_options(const struct tcp_copy *tc, __u32 thlen, struct syn_info *si)
{
	__u32 i = 0, optlen;

	if (!tc || !si)
		return -1;
	if (thlen <= 20 || thlen > 60)
		return 0;
	optlen = thlen - 20;
	for (int n = 0; n < 40; n++) {
		i = option_step(tc, i, optlen, si);
		if (i >= optlen)
			break;
	}
	return 0;
}

/* TSval carrying the options the cookie cannot hold, as the kernel's
 * cookie_init_timestamp() makes it: the millisecond clock with its low 6
 * bits replaced, never ahead of the clock. */
static __always_inline __u32 cookie_tsval(__u64 now_ns, const struct syn_info *si)
{
	__u64 now_ms = now_ns / 1000000;
	__u64 ts;
	__u32 options = si->has_ws ? si->ws : TS_OPT_WSCALE_NONE;

	if (si->sack)
		options |= TS_OPT_SACK;
	ts = (now_ms >> TSBITS) << TSBITS;
	ts |= options;
	if (ts > now_ms)
		ts -= 1ull << TSBITS;
	return (__u32)ts;
}

/* The 20 option bytes of the SYN-ACK: MSS, SACK permitted, timestamps and
 * window scale when the SYN had timestamps (the cookie can carry SACK and
 * window scale only in TSval), else MSS alone. */
static __always_inline void write_options(__u8 *o, __u16 mss, const struct syn_info *si,
					  __u32 tsval, __u32 wscale)
{
	o[0] = TCPOPT_MAXSEG;
	o[1] = TCPOLEN_MAXSEG;
	o[2] = mss >> 8;
	o[3] = mss & 0xff;
	if (!si->has_ts) {
		__builtin_memset(o + 4, TCPOPT_NOP, 16);
		return;
	}
	if (si->sack) {
		o[4] = TCPOPT_SACK_PERM;
		o[5] = TCPOLEN_SACK_PERM;
	} else {
		o[4] = TCPOPT_NOP;
		o[5] = TCPOPT_NOP;
	}
	o[6] = TCPOPT_TIMESTAMP;
	o[7] = TCPOLEN_TIMESTAMP;
	o[8] = tsval >> 24;
	o[9] = tsval >> 16;
	o[10] = tsval >> 8;
	o[11] = tsval;
	o[12] = si->tsval >> 24;
	o[13] = si->tsval >> 16;
	o[14] = si->tsval >> 8;
	o[15] = si->tsval;
	o[16] = TCPOPT_NOP;
	if (si->has_ws) {
		o[17] = TCPOPT_WINDOW;
		o[18] = TCPOLEN_WINDOW;
		o[19] = wscale;
	} else {
		o[17] = TCPOPT_NOP;
		o[18] = TCPOPT_NOP;
		o[19] = TCPOPT_NOP;
	}
}

enum answer {
	ANSWERED,    /* XDP_TX */
	NO_PRESSURE, /* helper: -ENOENT (syncookies=1 and the queue is not full) */
	NO_LISTENER,
	CONNECTED,   /* the lookup found a connection, not a listener */
	FAILED,
};

/* Counts a source of a SYN answered in flood mode: the IPv4 address or
 * the IPv6 /64 (saddr6's first two words). */
static __always_inline void count_source(int v6, __u32 saddr4, const __u32 *saddr6)
{
	__u64 one = 1, *v;

	if (v6) {
		__u64 key = ((__u64)saddr6[1] << 32) | saddr6[0];

		v = bpf_map_lookup_elem(&top_v6, &key);
		if (v)
			__sync_fetch_and_add(v, 1);
		else
			bpf_map_update_elem(&top_v6, &key, &one, BPF_NOEXIST);
	} else {
		v = bpf_map_lookup_elem(&top_v4, &saddr4);
		if (v)
			__sync_fetch_and_add(v, 1);
		else
			bpf_map_update_elem(&top_v4, &saddr4, &one, BPF_NOEXIST);
	}
}

/* IPv4 addresses Linux never answers a SYN from or to (ip_route_input_slow's
 * martians, tcp_v4_conn_request's broadcast and multicast): 0.0.0.0/8,
 * 127.0.0.0/8 (martian unless route_localnet; the kernel decides then),
 * 224.0.0.0/4 and 255.255.255.255. A subnet's broadcast address needs the
 * routes: not checked. */
static __always_inline int martian4(__be32 addr)
{
	__u32 a = bpf_ntohl(addr);

	return (a >> 24) == 0 || (a >> 24) == 127 || (a >> 28) == 0xe || a == 0xffffffff;
}

/* IPv6 likewise (ipv6_rcv_core, tcp_v6_conn_request): ff00::/8, ::1, ::
 * (no peer to answer) and ::ffff:0:0/96 (IPv4-mapped). */
static __always_inline int martian6(const struct in6_addr *addr)
{
	__u32 w0 = addr->in6_u.u6_addr32[0], w1 = addr->in6_u.u6_addr32[1];
	__u32 w2 = addr->in6_u.u6_addr32[2], w3 = addr->in6_u.u6_addr32[3];

	if ((bpf_ntohl(w0) >> 24) == 0xff)
		return 1;
	if (w0 || w1)
		return 0;
	if (w2 == bpf_htonl(0xffff))
		return 1;
	return w2 == 0 && (w3 == 0 || w3 == bpf_htonl(1));
}

enum check {
	CHECK_OK,
	CHECK_MARTIAN,
	CHECK_MALFORMED,
};

/* What the kernel would make of the SYN at l3/th before any listener sees
 * it (frame: the frame's length; l3off: the IP header's offset). What it
 * drops is passed to it (XDP_PASS, as for all we do not answer), not
 * dropped here: the drop and its count stay the kernel's. */
static __always_inline enum check check_syn(const void *l3, const struct tcphdr *th, int v6,
					     __u32 l3off, __u32 frame)
{
	__u32 thlen = th->doff * 4;

	if (v6) {
		const struct ipv6hdr *ip6 = l3;
		__u32 plen = bpf_ntohs(ip6->payload_len);

		if (martian6(&ip6->saddr) || martian6(&ip6->daddr))
			return CHECK_MARTIAN;
		if (thlen < sizeof(*th) || plen < thlen || l3off + sizeof(*ip6) + plen > frame)
			return CHECK_MALFORMED;
	} else {
		const struct iphdr *ip4 = l3;
		__u32 tot = bpf_ntohs(ip4->tot_len);

		if (martian4(ip4->saddr) || martian4(ip4->daddr))
			return CHECK_MARTIAN;
		if (thlen < sizeof(*th) || tot < sizeof(*ip4) + thlen || l3off + tot > frame)
			return CHECK_MALFORMED;
	}
	return CHECK_OK;
}

/* Get a cookie for the SYN at l3/th and turn the frame into its SYN-ACK.
 * l3off is the offset of the IP header, v6 says which one. */
static __always_inline enum answer answer(struct xdp_md *ctx, __u32 l3off, int v6,
					  const struct sg_config *cfg, __u64 now, int sample)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct bpf_sock_tuple tup = {};
	struct tcp_copy tc;
	struct syn_info si = {};
	struct bpf_sock *sk;
	struct ethhdr *eth = data;
	struct tcphdr *th;
	__u8 src_mac[ETH_ALEN], dst_mac[ETH_ALEN];
	__u32 saddr6[4], daddr6[4], saddr4 = 0, daddr4 = 0;
	__u32 l3len = v6 ? sizeof(struct ipv6hdr) : sizeof(struct iphdr);
	__u32 thlen, seq, tsval = 0, new_len;
	__u16 sport, dport, mss;
	__s64 cookie;
	void *l3;
	int delta;

	if ((void *)(eth + 1) > data_end)
		return FAILED;
	l3 = data + (l3off & 0xff);
	th = l3 + l3len;
	if ((void *)(th + 1) > data_end)
		return FAILED;
	thlen = th->doff * 4;
	if (thlen < sizeof(struct tcphdr))
		return FAILED;

	if (v6) {
		struct ipv6hdr *ip6 = l3;

		if ((void *)(ip6 + 1) > data_end)
			return FAILED;
		__builtin_memcpy(tup.ipv6.saddr, &ip6->saddr, 16);
		__builtin_memcpy(tup.ipv6.daddr, &ip6->daddr, 16);
		tup.ipv6.sport = th->source;
		tup.ipv6.dport = th->dest;
		sk = (struct bpf_sock *)bpf_skc_lookup_tcp(ctx, &tup, sizeof(tup.ipv6),
							   BPF_F_CURRENT_NETNS, 0);
	} else {
		struct iphdr *ip4 = l3;

		if ((void *)(ip4 + 1) > data_end)
			return FAILED;
		tup.ipv4.saddr = ip4->saddr;
		tup.ipv4.daddr = ip4->daddr;
		tup.ipv4.sport = th->source;
		tup.ipv4.dport = th->dest;
		sk = (struct bpf_sock *)bpf_skc_lookup_tcp(ctx, &tup, sizeof(tup.ipv4),
							   BPF_F_CURRENT_NETNS, 0);
	}
	if (!sk)
		return NO_LISTENER;
	if (sk->state != BPF_TCP_LISTEN) {
		/* A SYN for an existing connection (TIME_WAIT reuse, a request
		 * in progress): the kernel knows what to do with it. */
		bpf_sk_release(sk);
		return CONNECTED;
	}

	__builtin_memset(&tc, 0, sizeof(tc));
	if (bpf_xdp_load_bytes(ctx, (l3off & 0xff) + l3len, &tc, thlen & 0x3f) < 0) {
		bpf_sk_release(sk);
		return FAILED;
	}
	/* The packet pointers are still valid: load_bytes does not move data. */
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	l3 = data + (l3off & 0xff);
	if (v6) {
		if (l3 + sizeof(struct ipv6hdr) > data_end) {
			bpf_sk_release(sk);
			return FAILED;
		}
		cookie = bpf_tcp_gen_syncookie(sk, l3, sizeof(struct ipv6hdr), (struct tcphdr *)&tc,
					       thlen & 0x3f);
	} else {
		if (l3 + sizeof(struct iphdr) > data_end) {
			bpf_sk_release(sk);
			return FAILED;
		}
		cookie = bpf_tcp_gen_syncookie(sk, l3, sizeof(struct iphdr), (struct tcphdr *)&tc, thlen & 0x3f);
	}
	bpf_sk_release(sk);
	if (cookie == -ENOENT)
		return NO_PRESSURE;
	if (cookie < 0)
		return FAILED;
	/* The cookie keeps the client's MSS (bits 32-47 of what the helper
	 * returns, for our sending side); the SYN-ACK says what we receive. */
	mss = v6 ? cfg->mss6 : cfg->mss4;

	/* Everything the reply needs from the SYN, before the frame changes. */
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > data_end)
		return FAILED;
	l3 = data + (l3off & 0xff);
	if (l3 + l3len + sizeof(struct tcphdr) > data_end)
		return FAILED;
	th = l3 + l3len;
	if ((void *)(th + 1) > data_end)
		return FAILED;
	parse_options(&tc, thlen & 0x3f, &si);
	/* Options the host turned off are neither offered nor encoded: the
	 * kernel's cookie check refuses an ACK whose TSecr claims them. */
	if (!(cfg->flags & SG_F_SACK))
		si.sack = 0;
	if (!(cfg->flags & SG_F_WSCALE))
		si.has_ws = 0;
	__builtin_memcpy(src_mac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(dst_mac, eth->h_dest, ETH_ALEN);
	sport = th->source;
	dport = th->dest;
	seq = bpf_ntohl(th->seq);
	if (v6) {
		struct ipv6hdr *ip6 = l3;

		if ((void *)(ip6 + 1) > data_end)
			return FAILED;
		__builtin_memcpy(saddr6, &ip6->saddr, 16);
		__builtin_memcpy(daddr6, &ip6->daddr, 16);
	} else {
		struct iphdr *ip4 = l3;

		if ((void *)(ip4 + 1) > data_end)
			return FAILED;
		saddr4 = ip4->saddr;
		daddr4 = ip4->daddr;
	}
	if (si.has_ts)
		tsval = cookie_tsval(now, &si);

	/* Resize the frame to Ethernet + IP + 40 bytes of TCP. A SYN with
	 * fewer options (hping3's have none) needs more room: take it at the
	 * front, where XDP guarantees XDP_PACKET_HEADROOM (256 bytes), not at
	 * the end, where a veth frame built on a small skb has next to none.
	 * Every header is written afresh below, so where the old ones were
	 * does not matter. */
	new_len = l3len + SYNACK_TCP_LEN + sizeof(struct ethhdr);
	delta = (int)new_len - (int)(data_end - data);
	if (delta > 0 && bpf_xdp_adjust_head(ctx, -delta))
		return FAILED;
	if (delta < 0 && bpf_xdp_adjust_tail(ctx, delta))
		return FAILED;
	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	if ((void *)(eth + 1) > data_end)
		return FAILED;
	__builtin_memcpy(eth->h_dest, src_mac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, dst_mac, ETH_ALEN);
	eth->h_proto = bpf_htons(v6 ? ETH_P_IPV6 : ETH_P_IP);
	l3 = (void *)(eth + 1);

	if (v6) {
		struct ipv6hdr *ip6 = l3;
		struct {
			__u32 saddr[4], daddr[4];
			__be32 len, nexthdr;
		} ph;
		__s64 sum;

		th = (void *)(ip6 + 1);
		if ((void *)th + SYNACK_TCP_LEN > data_end)
			return FAILED;
		*(__be32 *)ip6 = bpf_htonl(6u << 28); /* version, no class or label */
		ip6->payload_len = bpf_htons(SYNACK_TCP_LEN);
		ip6->nexthdr = IPPROTO_TCP;
		ip6->hop_limit = 64;
		__builtin_memcpy(&ip6->saddr, daddr6, 16);
		__builtin_memcpy(&ip6->daddr, saddr6, 16);
		__builtin_memcpy(ph.saddr, daddr6, 16);
		__builtin_memcpy(ph.daddr, saddr6, 16);
		ph.len = bpf_htonl(SYNACK_TCP_LEN);
		ph.nexthdr = bpf_htonl(IPPROTO_TCP);

		th->source = dport;
		th->dest = sport;
		th->seq = bpf_htonl((__u32)cookie);
		th->ack_seq = bpf_htonl(seq + 1);
		*((__u16 *)th + 6) = bpf_htons((SYNACK_TCP_LEN / 4) << 12 | 0x12);
		th->window = bpf_htons(SYNACK_WINDOW);
		th->check = 0;
		th->urg_ptr = 0;
		write_options((__u8 *)(th + 1), mss, &si, tsval, cfg->wscale);
		sum = bpf_csum_diff(0, 0, (__be32 *)&ph, sizeof(ph), 0);
		if (sum < 0)
			return FAILED;
		sum = bpf_csum_diff(0, 0, (__be32 *)th, SYNACK_TCP_LEN, (__u32)sum);
		if (sum < 0)
			return FAILED;
		th->check = csum_fold((__u32)sum);
	} else {
		struct iphdr *ip4 = l3;
		struct {
			__u32 saddr, daddr;
			__be32 proto_len;
		} ph;
		__s64 sum;

		th = (void *)(ip4 + 1);
		if ((void *)th + SYNACK_TCP_LEN > data_end)
			return FAILED;
		*(__u8 *)ip4 = 0x45; /* version 4, 5 words */
		ip4->tos = 0;
		ip4->tot_len = bpf_htons(sizeof(*ip4) + SYNACK_TCP_LEN);
		ip4->id = 0;
		ip4->frag_off = bpf_htons(0x4000); /* DF */
		ip4->ttl = 64;
		ip4->protocol = IPPROTO_TCP;
		ip4->saddr = daddr4;
		ip4->daddr = saddr4;
		ip4->check = 0;
		sum = bpf_csum_diff(0, 0, (__be32 *)ip4, sizeof(*ip4), 0);
		if (sum < 0)
			return FAILED;
		ip4->check = csum_fold((__u32)sum);
		ph.saddr = daddr4;
		ph.daddr = saddr4;
		ph.proto_len = bpf_htonl(IPPROTO_TCP << 16 | SYNACK_TCP_LEN);

		th->source = dport;
		th->dest = sport;
		th->seq = bpf_htonl((__u32)cookie);
		th->ack_seq = bpf_htonl(seq + 1);
		*((__u16 *)th + 6) = bpf_htons((SYNACK_TCP_LEN / 4) << 12 | 0x12);
		th->window = bpf_htons(SYNACK_WINDOW);
		th->check = 0;
		th->urg_ptr = 0;
		write_options((__u8 *)(th + 1), mss, &si, tsval, cfg->wscale);
		sum = bpf_csum_diff(0, 0, (__be32 *)&ph, sizeof(ph), 0);
		if (sum < 0)
			return FAILED;
		sum = bpf_csum_diff(0, 0, (__be32 *)th, SYNACK_TCP_LEN, (__u32)sum);
		if (sum < 0)
			return FAILED;
		th->check = csum_fold((__u32)sum);
	}
	if (sample)
		count_source(v6, saddr4, saddr6);
	return ANSWERED;
}

SEC("xdp")
int syngate(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct tcphdr *th;
	struct sg_config *cfg;
	struct sg_counters *cnt;
	struct sg_state *st;
	__u32 key = 0, port, slot, *slotp, l3off = sizeof(*eth);
	__u64 now;
	int v6, try = 0, probe = 0, sample;
	enum answer a;

	if ((void *)(eth + 1) > data_end)
		return XDP_PASS;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip4 = (void *)(eth + 1);

		if ((void *)(ip4 + 1) > data_end)
			return XDP_PASS;
		/* IPv4 options and fragments go to the kernel. */
		if (ip4->ihl != 5 || ip4->protocol != IPPROTO_TCP ||
		    (ip4->frag_off & bpf_htons(0x3fff)))
			return XDP_PASS;
		th = (void *)(ip4 + 1);
		v6 = 0;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return XDP_PASS;
		/* Extension headers go to the kernel. */
		if (ip6->nexthdr != IPPROTO_TCP)
			return XDP_PASS;
		th = (void *)(ip6 + 1);
		v6 = 1;
	} else {
		return XDP_PASS;
	}
	if ((void *)(th + 1) > data_end)
		return XDP_PASS;
	/* SYN alone (ECE/CWR/PSH/URG allowed, as the kernel does). */
	if ((((__u8 *)th)[13] & 0x17) != 0x02)
		return XDP_PASS;

	port = bpf_ntohs(th->dest);
	slotp = bpf_map_lookup_elem(&ports, &port);
	if (!slotp || *slotp == 0 || *slotp > SG_MAX_PORTS)
		return XDP_PASS;
	slot = *slotp - 1;
	cfg = bpf_map_lookup_elem(&config, &key);
	cnt = bpf_map_lookup_elem(&counters, &slot);
	st = bpf_map_lookup_elem(&state, &slot);
	if (!cfg || !cnt || !st)
		return XDP_PASS;
	/* Not sent to us (see the top of this file): not counted, not ours. */
	for (int i = 0; i < ETH_ALEN; i++)
		if (eth->h_dest[i] != cfg->if_mac[i])
			return XDP_PASS;
	cnt->syn_seen++;
	/* Before the mode: such SYNs take no probe and keep no flood going. */
	switch (check_syn(eth + 1, th, v6, l3off, data_end - data)) {
	case CHECK_MARTIAN:
		cnt->martian++;
		cnt->passed++;
		return XDP_PASS;
	case CHECK_MALFORMED:
		cnt->malformed++;
		cnt->passed++;
		return XDP_PASS;
	default:
		break;
	}

	now = bpf_ktime_get_ns();
	if (cfg->mode == SG_MODE_ALWAYS) {
		try = 1;
	} else if (cfg->mode == SG_MODE_AUTO) {
		if (st->flood) {
			if (now - st->last_cookie_ns > cfg->t2_ns) {
				st->flood = 0;
				__sync_fetch_and_add(&st->flood_left, 1);
			} else {
				try = 1;
			}
		}
		if (!try && now - st->last_try_ns >= cfg->t1_ns) {
			st->last_try_ns = now;
			try = 1;
			probe = 1;
			cnt->sampled++;
		}
	}
	if (!try) {
		cnt->passed++;
		return XDP_PASS;
	}

	sample = (bpf_get_prandom_u32() & cfg->top_sample_mask) == 0;
	a = answer(ctx, l3off, v6, cfg, now, sample && !probe);
	switch (a) {
	case ANSWERED:
		cnt->cookies++;
		st->last_cookie_ns = now;
		if (cfg->mode == SG_MODE_AUTO && !st->flood) {
			st->flood = 1;
			__sync_fetch_and_add(&st->flood_entered, 1);
		}
		return XDP_TX;
	case NO_PRESSURE:
	case CONNECTED:
		break;
	case NO_LISTENER:
		cnt->no_listener++;
		break;
	default:
		cnt->errors++;
		break;
	}
	cnt->passed++;
	return XDP_PASS;
}

/* For the far end of a veth pair: frames sent there with XDP_TX are
 * dropped unless that end has an XDP program of its own. */
SEC("xdp")
int xdp_pass(struct xdp_md *ctx)
{
	return XDP_PASS;
}

char _license[] SEC("license") = "GPL";
