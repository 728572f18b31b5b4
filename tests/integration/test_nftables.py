"""honk's nftables table: the ruleset as text, accepted by the kernel in check mode, installed
in a network namespace the test creates (a stale table replaced, not duplicated), and removed
leaving the namespace's ruleset exactly as it was."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from helpers.netns import scratch_netns

from honk.netlink.nftables import (
    Interception,
    NftError,
    install_script,
    list_table,
    remove_script,
    ruleset,
    run_nft,
)

SPEC = Interception(("hkc1", "br-lan"), 7893)


@pytest.fixture
def netns() -> Iterator[str]:
    with scratch_netns("nftables tests", "nft") as name:
        yield name


def ruleset_of(name: str) -> str:
    return subprocess.run(
        ["ip", "netns", "exec", name, "nft", "list", "ruleset"], capture_output=True, text=True, check=True
    ).stdout


def test_the_ruleset_diverts_lan_tcp_and_udp_and_fails_closed_after_the_tproxy_rules():
    text = ruleset(SPEC)
    lines = [line.strip() for line in text.splitlines()]
    tproxy = [i for i, line in enumerate(lines) if " tproxy " in line]
    drop = lines.index("meta l4proto { tcp, udp } drop")
    assert len(tproxy) == 4 and max(tproxy) < drop  # TCP and UDP, IPv4 and IPv6, then the drop
    assert 'iifname != { "hkc1", "br-lan" } return' in lines
    assert "meta mark & 0x100 == 0x100 return" in lines  # honk's own upstream sockets
    assert all("meta mark set 0x08000000" in lines[i] for i in tproxy)
    with pytest.raises(ValueError):
        ruleset(Interception((), 7893))
    with pytest.raises(ValueError):
        ruleset(Interception(("lan",), 0))


def test_the_kernel_accepts_the_ruleset_in_check_mode(netns):
    run_nft(install_script(SPEC), check=True, netns=netns)
    assert list_table(netns) is None  # check mode changes nothing


def test_installing_replaces_a_stale_table_and_removing_restores_the_ruleset(netns):
    before = ruleset_of(netns)
    run_nft(install_script(Interception(("old0",), 1234)), netns=netns)  # a crashed run's table
    run_nft(install_script(SPEC), netns=netns)
    run_nft(install_script(SPEC), netns=netns)  # twice: still one copy of each rule
    table = list_table(netns)
    assert table is not None and table.count("tproxy") == 4 and ":7893" in table and "old0" not in table
    run_nft(remove_script(), netns=netns)
    run_nft(remove_script(), netns=netns)  # removing what is gone is no error
    assert list_table(netns) is None
    assert ruleset_of(netns) == before


def test_a_refused_ruleset_raises_with_nfts_own_words(netns):
    with pytest.raises(NftError, match="Error"):
        run_nft("table inet honk { chain c { type filter hook nowhere priority 0; } }", netns=netns)


def test_with_wan_interfaces_the_output_chain_marks_the_hosts_own_flows_for_the_divert_chain():
    text = ruleset(Interception((), 7893, wan_interfaces=("wan0", "ppp0")))
    lines = [line.strip() for line in text.splitlines()]
    output = lines[lines.index("chain output {") :]
    assert output[1] == "type route hook output priority mangle; policy accept;"  # a changed mark re-routes
    assert output[2] == "meta mark != 0 return"  # honk's own sockets first, whatever their mark
    assert output[3] == 'oifname != { "wan0", "ppp0" } return'
    assert output.index("meta l4proto { tcp, udp } meta mark set 0x08000000") > output.index(
        "ip6 daddr @bypass6 return"
    )
    prerouting = lines[lines.index("chain prerouting {") : lines.index("chain output {")]
    # back from lo only what the output chain marked; without LAN interfaces nothing else
    assert prerouting[3:5] == ["iifname lo meta mark & 0x08000000 == 0x08000000 jump divert", "return"]


def test_the_kernel_accepts_lan_and_wan_rulesets_in_check_mode(netns):
    for spec in (
        Interception((), 7893, wan_interfaces=("wan0",)),
        Interception(("hkc1",), 7893, wan_interfaces=("wan0",)),
    ):
        run_nft(install_script(spec), check=True, netns=netns)
