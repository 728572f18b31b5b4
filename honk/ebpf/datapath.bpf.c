// SPDX-License-Identifier: GPL-3.0-only
/*
 * honk's kernel datapath: a tc ingress classifier (direct action) on the LAN interfaces.
 *
 * For each IPv4/IPv6 TCP or UDP packet it walks the kernel rule table (the prefix of the
 * routing rules the kernel can evaluate, compiled by honk/ebpf/kernel_rules.py) in order;
 * the first matching entry names a group ordinal or NOT_A_GROUP. A packet whose group has
 * no live path for its protocol and family is dropped here, before TPROXY hands it to
 * userspace; everything else passes. DNS (TCP or UDP destination port 53) always passes.
 *
 * Every uncertainty passes (fail-open): a packet that cannot be parsed, an unwritten slot,
 * a slot beyond the map, an empty or unpublished rule table.
 *
 * Maps (pinned by honk under its pin directory; also LIBBPF_PIN_BY_NAME for tc/ip loaders):
 *   honk_alive       u32 slot -> u64: 1 alive, 0 dead. slot = ordinal*4 + network*2 + family
 *                    (network TCP 0 / UDP 1, family V4 0 / V6 1). honk fills a new map with 1
 *                    before anything reads it, so an unwritten slot reads alive.
 *   honk_rules       two banks of HONK_RULES_MAX entries (struct honk_rule); honk writes the
 *                    inactive bank, then switches honk_rules_meta, so a half-written table is
 *                    never read.
 *   honk_rules_meta  [0] = bank << 32 | count: the published bank and its entry count (0: none).
 *   honk_stats       per-CPU counters: passed, dropped, dns_passed.
 */
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define HONK_GROUPS_MAX 1024
#define HONK_SLOTS_PER_GROUP 4
#define HONK_SLOTS_MAX (HONK_GROUPS_MAX * HONK_SLOTS_PER_GROUP)
#define HONK_RULES_MAX 128 /* = kernel_rules.KERNEL_RULES_MAX */
#define HONK_RULE_BANKS 2
#define NOT_A_GROUP 0xffffffffu
#define DNS_PORT 53
#define IP_FRAGMENT_OFFSET 0x1fff
#define IPV4_MAPPED_WORD 0xffff /* ::ffff:a.b.c.d */

enum honk_stat { HONK_PASSED = 0, HONK_DROPPED = 1, HONK_DNS_PASSED = 2, HONK_STATS };

struct honk_rule {
	__u32 addr[4];  /* network order; IPv4 in addr[0], the rest 0 */
	__u32 mask[4];  /* network order; the prefix as a mask */
	__u8 family;    /* 0 any, 4, 6 */
	__u8 prefix_len;
	__u8 l4proto;   /* 0 any, IPPROTO_TCP, IPPROTO_UDP */
	__u8 pad;
	__u16 dport_lo; /* host order, inclusive */
	__u16 dport_hi;
	__u32 target;   /* group ordinal, or NOT_A_GROUP */
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HONK_SLOTS_MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} honk_alive SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, HONK_RULES_MAX * HONK_RULE_BANKS);
	__type(key, __u32);
	__type(value, struct honk_rule);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} honk_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} honk_rules_meta SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, HONK_STATS);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} honk_stats SEC(".maps");

static __always_inline int count(__u32 stat, int verdict)
{
	__u64 *counter = bpf_map_lookup_elem(&honk_stats, &stat);

	if (counter)
		*counter += 1;
	return verdict;
}

/* The first matching entry's target, or NOT_A_GROUP. */
static __always_inline __u32 classify(const __u32 ip[4], __u8 family, __u8 l4proto, __u16 dport)
{
	__u32 zero = 0, bank, entries, i;
	__u64 *meta = bpf_map_lookup_elem(&honk_rules_meta, &zero);

	if (!meta)
		return NOT_A_GROUP;
	bank = (__u32)(*meta >> 32) & 1;
	entries = (__u32)*meta;
	for (i = 0; i < HONK_RULES_MAX; i++) {
		__u32 key = bank * HONK_RULES_MAX + i;
		struct honk_rule *rule;

		if (i >= entries)
			break;
		rule = bpf_map_lookup_elem(&honk_rules, &key);
		if (!rule)
			break;
		if (rule->family && rule->family != family)
			continue;
		if (rule->l4proto && rule->l4proto != l4proto)
			continue;
		if (dport < rule->dport_lo || dport > rule->dport_hi)
			continue;
		if ((ip[0] & rule->mask[0]) != rule->addr[0] || (ip[1] & rule->mask[1]) != rule->addr[1] ||
		    (ip[2] & rule->mask[2]) != rule->addr[2] || (ip[3] & rule->mask[3]) != rule->addr[3])
			continue;
		return rule->target;
	}
	return NOT_A_GROUP;
}

SEC("tc")
int honk_tc(struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	__u32 ip[4] = {0, 0, 0, 0};
	__u8 family, l4proto;
	__u16 *ports;
	__u16 dport;
	__u32 target, slot;
	__u64 *alive;

	if ((void *)(eth + 1) > data_end)
		return count(HONK_PASSED, TC_ACT_OK);
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *iph = (void *)(eth + 1);

		if ((void *)(iph + 1) > data_end || iph->ihl < 5)
			return count(HONK_PASSED, TC_ACT_OK);
		if (iph->frag_off & bpf_htons(IP_FRAGMENT_OFFSET))
			return count(HONK_PASSED, TC_ACT_OK); /* a later fragment: no ports to read */
		family = 4;
		l4proto = iph->protocol;
		ip[0] = iph->daddr;
		ports = (void *)iph + iph->ihl * 4;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6h = (void *)(eth + 1);

		if ((void *)(ip6h + 1) > data_end)
			return count(HONK_PASSED, TC_ACT_OK);
		family = 6;
		l4proto = ip6h->nexthdr; /* extension headers are not followed: such packets pass */
		ip[0] = ip6h->daddr.in6_u.u6_addr32[0];
		ip[1] = ip6h->daddr.in6_u.u6_addr32[1];
		ip[2] = ip6h->daddr.in6_u.u6_addr32[2];
		ip[3] = ip6h->daddr.in6_u.u6_addr32[3];
		ports = (void *)(ip6h + 1);
		/* an IPv4-mapped destination: the router matches it as IPv4, so it is not judged here */
		if (ip[0] == 0 && ip[1] == 0 && ip[2] == bpf_htonl(IPV4_MAPPED_WORD))
			return count(HONK_PASSED, TC_ACT_OK);
	} else {
		return count(HONK_PASSED, TC_ACT_OK);
	}
	if (l4proto != IPPROTO_TCP && l4proto != IPPROTO_UDP)
		return count(HONK_PASSED, TC_ACT_OK);
	if ((void *)(ports + 2) > data_end)
		return count(HONK_PASSED, TC_ACT_OK);
	dport = bpf_ntohs(ports[1]);
	if (dport == DNS_PORT)
		return count(HONK_DNS_PASSED, TC_ACT_OK);

	target = classify(ip, family, l4proto, dport);
	if (target >= HONK_GROUPS_MAX)
		return count(HONK_PASSED, TC_ACT_OK); /* NOT_A_GROUP: direct, block, a node */
	slot = target * HONK_SLOTS_PER_GROUP + (l4proto == IPPROTO_UDP ? 2 : 0) + (family == 6 ? 1 : 0);
	alive = bpf_map_lookup_elem(&honk_alive, &slot);
	if (alive && *alive == 0)
		return count(HONK_DROPPED, TC_ACT_SHOT);
	return count(HONK_PASSED, TC_ACT_OK);
}

char LICENSE[] SEC("license") = "GPL";
