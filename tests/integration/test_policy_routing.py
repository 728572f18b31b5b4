"""TPROXY's policy routing in a network namespace the test creates: marked packets look up
honk's table, which delivers locally; installing again keeps one copy, and removing leaves
the namespace's rules and routes exactly as they were."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from helpers.netns import scratch_netns

from honk.netlink.routing import PolicyRouting, install, remove

ROUTING = PolicyRouting()


@pytest.fixture
def netns() -> Iterator[str]:
    with scratch_netns("policy routing tests") as name:
        yield name


def state(name: str) -> str:
    out = []
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


def test_marked_packets_are_delivered_locally_and_removal_restores_everything(netns):
    subprocess.run(["ip", "-n", netns, "link", "set", "lo", "up"], check=True)  # as on any host
    before = state(netns)
    install(ROUTING, netns)
    install(ROUTING, netns)  # a second install keeps one copy
    rules = subprocess.run(
        ["ip", "-n", netns, "-4", "rule"], capture_output=True, text=True, check=True
    ).stdout
    assert rules.count("fwmark 0x8000000/0x8000000 lookup 2023") == 1
    routes = subprocess.run(
        ["ip", "-n", netns, "-6", "route", "show", "table", "2023"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "local default dev lo" in routes
    # a packet carrying the mark to any address is routed to the local host
    got = subprocess.run(
        ["ip", "-n", netns, "route", "get", "198.51.100.7", "mark", "0x8000000"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert got.startswith("local 198.51.100.7") and "table 2023" in got
    remove(ROUTING, netns)
    remove(ROUTING, netns)  # removing what is gone is no error
    assert state(netns) == before
