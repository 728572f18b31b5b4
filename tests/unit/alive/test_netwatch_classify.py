"""classify() on real rtnetlink bytes (pyroute2 encodes them; honk's own decoder parses them as the
watcher's socket would), and the watcher's burst coalescing on a FakeClock, without a netlink socket."""

import errno
import logging
import socket

import pytest
from pyroute2.netlink.rtnl import (
    RTM_DELADDR,
    RTM_DELLINK,
    RTM_DELROUTE,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTM_NEWNEIGH,
    RTM_NEWROUTE,
)
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.ndmsg import ndmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from honk.alive import netwatch
from honk.alive.netwatch import (
    NETWORK_CHANGE_SETTLE,
    NetworkWatcher,
    NetworkWatchError,
    SeenState,
    classify,
)
from honk.alive.rtnl import parse_messages
from honk.core.clock import FakeClock

IFF_UP, IFF_BROADCAST, IFF_RUNNING, IFF_PROMISC, IFF_LOWER_UP = 0x1, 0x2, 0x40, 0x100, 0x10000
UP_FLAGS = IFF_UP | IFF_BROADCAST | IFF_RUNNING | IFF_LOWER_UP
IFA_F_TENTATIVE, IFA_F_PERMANENT = 0x40, 0x80
RT_TABLE_LOCAL, RT_TABLE_MAIN = 255, 254


def _parsed(msg):
    msg.encode()
    (out,) = parse_messages(msg.data)
    return out


def link(index, flags=UP_FLAGS, operstate="UP", kind=RTM_NEWLINK, family=socket.AF_UNSPEC):
    msg = ifinfmsg()
    msg["header"]["type"] = kind
    msg["family"], msg["index"], msg["flags"] = family, index, flags
    msg["attrs"] = [("IFLA_IFNAME", f"veth{index}"), ("IFLA_OPERSTATE", operstate)]
    return _parsed(msg)


def addr(index, address="192.0.2.1", prefixlen=24, flags=IFA_F_PERMANENT, kind=RTM_NEWADDR):
    msg = ifaddrmsg()
    msg["header"]["type"] = kind
    msg["family"] = socket.AF_INET6 if ":" in address else socket.AF_INET
    msg["index"], msg["prefixlen"], msg["flags"] = index, prefixlen, flags & 0xFF
    msg["attrs"] = [("IFA_ADDRESS", address), ("IFA_FLAGS", flags)]
    return _parsed(msg)


def route(table=RT_TABLE_MAIN, flags=0, kind=RTM_NEWROUTE, dst="198.51.100.0"):
    msg = rtmsg()
    msg["header"]["type"] = kind
    msg["family"], msg["dst_len"], msg["type"], msg["flags"] = socket.AF_INET, 24, 1, flags
    msg["table"] = table if table < 256 else 252  # RT_TABLE_COMPAT: the real id is in RTA_TABLE
    msg["attrs"] = [("RTA_DST", dst), ("RTA_TABLE", table)]
    return _parsed(msg)


# --- classify ----------------------------------------------------------------


def test_a_new_link_counts_and_an_identical_repeat_is_ignored():
    seen = SeenState()
    assert classify(link(3), seen) == "link"
    assert classify(link(3), seen) is None
    assert classify(link(4), seen) == "link"  # another ifindex is another link


def test_operstate_change_counts_even_when_the_flags_stay():
    seen = SeenState()
    classify(link(3, flags=IFF_UP | IFF_BROADCAST, operstate="DOWN"), seen)
    assert classify(link(3, flags=IFF_UP | IFF_BROADCAST, operstate="LOWERLAYERDOWN"), seen) == "link"


@pytest.mark.parametrize("lost", [IFF_UP, IFF_RUNNING], ids=["up", "running"])
def test_losing_up_or_running_counts_even_with_the_same_operstate(lost):
    seen = SeenState()
    classify(link(3), seen)
    assert classify(link(3, flags=UP_FLAGS & ~lost), seen) == "link"


def test_flags_other_than_up_and_running_do_not_count():
    seen = SeenState()
    classify(link(3), seen)
    assert classify(link(3, flags=UP_FLAGS | IFF_PROMISC), seen) is None
    assert classify(link(3, flags=UP_FLAGS & ~IFF_LOWER_UP), seen) is None


def test_deleted_link_counts_and_is_forgotten():
    seen = SeenState()
    classify(link(3), seen)
    assert classify(link(3, kind=RTM_DELLINK), seen) == "link"
    assert 3 not in seen.links
    assert classify(link(3), seen) == "link"  # the ifindex reappearing is a new link


def test_bridge_port_link_messages_are_ignored():
    seen = SeenState()
    assert classify(link(3, family=socket.AF_BRIDGE), seen) is None
    assert classify(link(3, family=socket.AF_BRIDGE, kind=RTM_DELLINK), seen) is None
    assert seen.links == {}


def test_address_add_and_delete_count_and_a_lifetime_refresh_does_not():
    seen = SeenState()
    assert classify(addr(3, "2001:db8::1", 64), seen) == "address"
    assert classify(addr(3, "2001:db8::1", 64), seen) is None  # RA refresh: same address, same flags
    assert classify(addr(3, "2001:db8::2", 64), seen) == "address"
    assert classify(addr(3, "2001:db8::1", 64, kind=RTM_DELADDR), seen) == "address"
    assert classify(addr(3, "2001:db8::1", 64), seen) == "address"  # re-added after the delete


def test_address_leaving_dad_tentative_state_counts():
    seen = SeenState()
    assert classify(addr(3, "2001:db8::1", 64, flags=IFA_F_PERMANENT | IFA_F_TENTATIVE), seen) == "address"
    assert classify(addr(3, "2001:db8::1", 64, flags=IFA_F_PERMANENT), seen) == "address"


def test_same_address_on_another_interface_is_another_address():
    seen = SeenState()
    classify(addr(3), seen)
    assert classify(addr(4), seen) == "address"


def test_main_table_routes_count_in_both_directions():
    seen = SeenState()
    assert classify(route(), seen) == "route"
    assert classify(route(kind=RTM_DELROUTE), seen) == "route"


@pytest.mark.parametrize(
    "table,flags",
    [(RT_TABLE_LOCAL, 0), (100, 0), (1000, 0), (RT_TABLE_MAIN, 0x200)],
    ids=["local-table", "policy-table", "table-above-255", "cloned"],
)
def test_local_other_table_and_cloned_routes_are_ignored(table, flags):
    seen = SeenState()
    assert classify(route(table=table, flags=flags), seen) is None
    assert classify(route(table=table, flags=flags, kind=RTM_DELROUTE), seen) is None


def test_neighbour_messages_are_not_changes():
    msg = ndmsg()
    msg["header"]["type"] = RTM_NEWNEIGH
    msg["family"], msg["ifindex"] = socket.AF_INET, 3
    assert classify(_parsed(msg), SeenState()) is None


# --- coalescing on a FakeClock -----------------------------------------------


async def test_three_events_in_a_burst_give_one_call_with_the_first_reason_after_settle():
    clock, calls = FakeClock(), []
    watcher = NetworkWatcher(calls.append, clock)
    watcher.feed(link(3))
    clock.advance(0.25)  # binary fractions keep the FakeClock sums exact
    watcher.feed(addr(3))
    watcher.feed(route())
    clock.advance(NETWORK_CHANGE_SETTLE - 0.25 - 1 / 64)
    assert calls == []
    clock.advance(1 / 64)
    assert calls == ["link"]
    clock.advance(10 * NETWORK_CHANGE_SETTLE)
    assert calls == ["link"]
    assert clock.sleepers == 0


async def test_an_event_after_a_settled_burst_starts_a_new_burst():
    clock, calls = FakeClock(), []
    watcher = NetworkWatcher(calls.append, clock, settle=0.5)
    watcher.feed(route())
    clock.advance(0.5)
    watcher.feed(addr(3))
    clock.advance(0.5 - 1 / 64)
    assert calls == ["route"]
    clock.advance(1 / 64)
    assert calls == ["route", "address"]


async def test_irrelevant_messages_do_not_arm_the_timer():
    clock, calls = FakeClock(), []
    watcher = NetworkWatcher(calls.append, clock)
    watcher.feed(link(3))
    clock.advance(NETWORK_CHANGE_SETTLE)
    watcher.feed(link(3))  # same state again
    watcher.feed(route(table=RT_TABLE_LOCAL))
    assert clock.sleepers == 0
    clock.advance(10 * NETWORK_CHANGE_SETTLE)
    assert calls == ["link"]


async def test_stop_cancels_a_pending_notification():
    clock, calls = FakeClock(), []
    watcher = NetworkWatcher(calls.append, clock)
    watcher.feed(link(3))
    await watcher.stop()
    await watcher.stop()  # idempotent
    clock.advance(10 * NETWORK_CHANGE_SETTLE)
    assert calls == [] and clock.sleepers == 0


async def test_a_failing_callback_is_logged_and_the_next_burst_still_notifies(caplog):
    clock, calls = FakeClock(), []

    def on_change(reason):
        calls.append(reason)
        if len(calls) == 1:
            raise RuntimeError("boom")

    watcher = NetworkWatcher(on_change, clock)
    with caplog.at_level(logging.ERROR, logger="honk.alive.netwatch"):
        watcher.feed(link(3))
        clock.advance(NETWORK_CHANGE_SETTLE)
    assert any("on_change failed" in r.getMessage() for r in caplog.records)
    watcher.feed(route())
    clock.advance(NETWORK_CHANGE_SETTLE)
    assert calls == ["link", "route"]


async def test_start_raises_a_typed_error_when_netlink_cannot_be_opened(monkeypatch):
    def refuse():
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(netwatch, "_open_netlink", refuse)
    watcher = NetworkWatcher(lambda reason: None, FakeClock())
    with pytest.raises(NetworkWatchError) as caught:
        await watcher.start()
    assert caught.value.reason == "netlink-unavailable"
    assert isinstance(caught.value.__cause__, PermissionError)
    assert not watcher.running


def test_negative_settle_is_refused():
    with pytest.raises(ValueError):
        NetworkWatcher(lambda reason: None, FakeClock(), settle=-1.0)
