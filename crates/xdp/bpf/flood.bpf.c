// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * The SYN flood generator's XDP mode (tlsgate-loadgen's synflood with
 * `Inject::XdpLive`): run by BPF_PROG_RUN with BPF_F_TEST_XDP_LIVE_FRAMES
 * on an IPv4 SYN template that user space built, it rewrites the fields
 * that vary per SYN (source address, IP id, source port, sequence number,
 * TSval) exactly as the AF_PACKET path's build_syn does, fixes both
 * checksums and returns XDP_TX, which BPF_PROG_RUN turns into a transmit
 * on the interface given as ingress_ifindex. On a veth the frame then
 * reaches the peer as an xdp_frame with XDP headroom, as a NIC's driver
 * would hand it to XDP, instead of as an skb that veth copies first.
 *
 * Only ever aimed at the namespaces tlsgate's tests and bench create.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/tcp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

/* The one entry of "flood_state", 16 bytes, written by user space:
 * next (u64, the index of the next SYN), src_first (u32, host order),
 * src_count (u32). */
struct flood_state {
	__u64 next;
	__u32 src_first;
	__u32 src_count;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct flood_state);
} flood_state SEC(".maps");

struct pseudo4 {
	__be32 saddr;
	__be32 daddr;
	__u8 zero;
	__u8 proto;
	__be16 len;
};

static __always_inline __u16 fold(__s64 s)
{
	__u64 x = (__u32)s;

	x = (x & 0xffff) + (x >> 16);
	x = (x & 0xffff) + (x >> 16);
	return ~(__u16)x;
}

SEC("xdp")
int synflood_tx(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct tcphdr *th = (void *)(ip + 1);
	__u32 key = 0;
	struct flood_state *st = bpf_map_lookup_elem(&flood_state, &key);
	struct pseudo4 ph;
	__u64 i;
	__u32 k;
	__s64 sum;

	if (!st || st->src_count == 0)
		return XDP_ABORTED;
	if ((void *)(th + 1) > data_end)
		return XDP_ABORTED;
	i = st->next++;
	k = (__u32)(i % st->src_count);

	ip->id = bpf_htons((__u16)i);
	ip->saddr = bpf_htonl(st->src_first + k);
	ip->check = 0;
	sum = bpf_csum_diff(0, 0, (__be32 *)ip, sizeof(*ip), 0);
	ip->check = fold(sum);

	th->source = bpf_htons(1024 + (__u16)((i * 7919) % 64000));
	th->seq = bpf_htonl((__u32)i * 2654435761u);
	th->check = 0;
	ph.saddr = ip->saddr;
	ph.daddr = ip->daddr;
	ph.zero = 0;
	ph.proto = IPPROTO_TCP;
	/* The template has 20 bytes of options (Linux-like) or none. */
	if ((void *)th + 40 <= data_end) {
		__be32 *tsval = (void *)th + 28;

		*tsval = bpf_htonl((__u32)i);
		ph.len = bpf_htons(40);
		sum = bpf_csum_diff(0, 0, (__be32 *)&ph, sizeof(ph), 0);
		sum = bpf_csum_diff(0, 0, (__be32 *)th, 40, sum);
	} else {
		ph.len = bpf_htons(20);
		sum = bpf_csum_diff(0, 0, (__be32 *)&ph, sizeof(ph), 0);
		sum = bpf_csum_diff(0, 0, (__be32 *)th, 20, sum);
	}
	th->check = fold(sum);
	return XDP_TX;
}

char _license[] SEC("license") = "GPL";
