"""The transparent listener's kernel state as one unit, in a namespace the test creates:
installing adds the table, the policy routing and (only when asked) the kernel parameters;
a crashed run's leftovers are replaced, not duplicated; removing restores the namespace's
ruleset, rules and routes exactly, and a second removal is no error."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from helpers.netns import scratch_netns

from honk.netlink.interception import InterceptionError, KernelInterception


@pytest.fixture
def netns() -> Iterator[str]:
    with scratch_netns("interception tests", "nft", "sysctl") as name:
        subprocess.run(["ip", "-n", name, "link", "set", "lo", "up"], check=True)
        subprocess.run(
            ["ip", "-n", name, "link", "add", "hkl0", "type", "veth", "peer", "name", "hkl1"], check=True
        )
        yield name


def kernel_state(name: str) -> str:
    out = [
        subprocess.run(
            ["ip", "netns", "exec", name, "nft", "list", "ruleset"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    ]
    for args in (
        ["-4", "rule"],
        ["-6", "rule"],
        ["-4", "route", "show", "table", "all"],
        ["-6", "route", "show", "table", "all"],
    ):
        out.append(
            subprocess.run(["ip", "-n", name, *args], capture_output=True, text=True, check=True).stdout
        )
    return "\n".join(out)


def sysctl(name: str, key: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", name, "sysctl", "-n", key], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_install_then_remove_leaves_the_namespace_exactly_as_it_was(netns):
    before = kernel_state(netns)
    spec = KernelInterception(("hkl0",), 7893, netns=netns)
    spec.install()
    spec.install()  # a restart after a crash: one table, one rule per family
    state = kernel_state(netns)
    assert state.count("table inet honk") == 1
    assert state.count("lookup 2023") == 2  # IPv4 and IPv6
    assert "tproxy ip to :7893" in state
    assert sysctl(netns, "net.ipv4.ip_forward") == "0"  # not asked to touch kernel parameters
    spec.remove()
    assert kernel_state(netns) == before
    spec.remove()  # removing twice is no error
    assert kernel_state(netns) == before


def test_kernel_parameters_are_set_only_when_asked(netns):
    spec = KernelInterception(("hkl0",), 7893, auto_config_kernel_parameter=True, netns=netns)
    subprocess.run(
        ["ip", "netns", "exec", netns, "sysctl", "-qw", "net.ipv4.conf.hkl0.rp_filter=1"], check=True
    )
    spec.install()
    try:
        assert sysctl(netns, "net.ipv4.ip_forward") == "1"
        assert sysctl(netns, "net.ipv6.conf.all.forwarding") == "1"
        assert sysctl(netns, "net.ipv4.conf.hkl0.rp_filter") == "0"
        assert sysctl(netns, "net.ipv4.conf.hkl0.send_redirects") == "0"
    finally:
        spec.remove()


def test_a_refused_install_names_the_part_and_leaves_nothing_behind(netns):
    before = kernel_state(netns)
    bad = KernelInterception(('bad"name',), 7893, netns=netns)  # nft refuses the quoted name
    with pytest.raises(InterceptionError, match="nftables"):
        bad.install()
    assert kernel_state(netns) == before


def test_auto_is_the_interface_of_the_lowest_metric_default_route(netns):
    ip = ["ip", "-n", netns]
    subprocess.run([*ip, "link", "add", "hkw0", "type", "veth", "peer", "name", "hkw0p"], check=True)
    subprocess.run([*ip, "link", "add", "hkw1", "type", "veth", "peer", "name", "hkw1p"], check=True)
    spec = KernelInterception((), 7893, wan_interfaces=("auto",), netns=netns)
    assert spec.wans() == ()  # no default route yet: pending, nothing intercepted
    spec.install()  # no error: the daemon starts, with a warning
    assert "table inet honk" not in kernel_state(netns)
    spec.remove()
    lan_auto = KernelInterception(("auto",), 7893, netns=netns)
    for dev, metric in (("hkw0", "200"), ("hkw1", "50")):
        for end in (dev, f"{dev}p"):
            subprocess.run([*ip, "link", "set", end, "up"], check=True)
        subprocess.run([*ip, "route", "add", "default", "dev", dev, "metric", metric], check=True)
    assert spec.wans() == ("hkw1",) and lan_auto.lans() == ("hkw1",)
    assert KernelInterception((), 7893, wan_interfaces=("hkw1", "auto"), netns=netns).wans() == ("hkw1",)
    before = kernel_state(netns)
    spec.install()
    try:
        assert 'oifname != "hkw1" return' in kernel_state(netns)
    finally:
        spec.remove()
    assert kernel_state(netns) == before
