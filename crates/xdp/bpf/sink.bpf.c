// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/*
 * For the client end of `tlsgate bench synflood`'s veth pair, in place of
 * a pass program: drops what is addressed to the flood's spoofed sources
 * (10.254.2.0/24 and fd00:254:2::/64, the ranges the bench uses and routes
 * only inside its namespaces) and passes everything else. Without it the
 * client namespace would drop the server's SYN-ACKs to those addresses in
 * its IP layer, on the client core the generators share.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

SEC("xdp")
int bench_sink(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return XDP_PASS;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip4 = (void *)(eth + 1);

		if ((void *)(ip4 + 1) > data_end)
			return XDP_PASS;
		if ((ip4->daddr & bpf_htonl(0xffffff00)) == bpf_htonl(0x0afe0200))
			return XDP_DROP;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > data_end)
			return XDP_PASS;
		if (ip6->daddr.s6_addr32[0] == bpf_htonl(0xfd000254) &&
		    ip6->daddr.s6_addr32[1] == bpf_htonl(0x00020000))
			return XDP_DROP;
	}
	return XDP_PASS;
}

char _license[] SEC("license") = "GPL";
