// SPDX-License-Identifier: GPL-2.0 OR Apache-2.0
/* A program the verifier refuses (a packet read without a bounds check),
 * for the test that the loader reports the verifier's log. */
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

SEC("xdp")
int syngate(struct xdp_md *ctx)
{
	unsigned char *data = (void *)(long)ctx->data;

	return data[20] == 6 ? XDP_DROP : XDP_PASS;
}

char _license[] SEC("license") = "GPL";
