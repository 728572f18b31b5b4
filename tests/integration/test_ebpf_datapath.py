"""The kernel datapath: group slots published into the pinned BPF map (and, with the same
assertions, into memory), the fail-open reload, pins surviving a restart, and the tc
classifier on a veth in a two-namespace test bed dropping a dead group's traffic only.

BPF parts need root and bpf(2) (with CI=true they fail instead of skipping); each mounts a
private bpffs under the test's temporary directory, so the host's /sys/fs/bpf is untouched.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from helpers.bpf import classifier_object, in_netns, private_bpffs, require_bpf
from helpers.netns import scratch_netns
from helpers.peers import require_binary, require_root

from honk._fast import bpfmap
from honk.alive.outcome import Family
from honk.config.links import with_node_id
from honk.config.spec import (
    FilterTerm,
    GroupSpec,
    MatchArg,
    NodeFilter,
    NodeSpec,
    Predicate,
    RoutingSpec,
    RuleSpec,
    Spec,
)
from honk.core.clock import FakeClock
from honk.core.net import Network
from honk.ebpf import loader
from honk.ebpf.datapath import MAP_ALIVE, MAP_RULES, MAP_RULES_META, SLOT_ALIVE, Datapath, slot_index
from honk.ebpf.kernel_rules import KERNEL_RULES_MAX, RULE_STRUCT, compile_kernel_rules
from honk.ebpf.layout import layout_of
from honk.ebpf.slots import SLOT_FAMILIES, SLOT_NETWORKS, GroupLayout, MemorySlots, SlotKey, SlotPublisher
from honk.group.manager import GroupManager
from honk.outbound.registry import build_outbounds

RECEIVE_TIMEOUT = 5.0  # seconds a packet that must arrive may take (it takes microseconds)
DATA_PORT = 9999
DNS_PORT = 53
TCP_PORT = 8080
DIRECT_PORT = 8081  # an earlier rule sends this port direct
SENDER_V4, RECEIVER_V4 = "198.51.100.1", "198.51.100.2"
SENDER_V6, RECEIVER_V6 = "2001:db8:1::1", "2001:db8:1::2"


# --- a world of nodes and groups -----------------------------------------------------------


def node(name: str) -> NodeSpec:
    return with_node_id(NodeSpec(name, "socks5", "127.0.0.1", 1000 + sum(map(ord, name))))


def group(name: str, *members: str, subgroups: tuple[str, ...] = (), **kw) -> GroupSpec:
    filters = (NodeFilter((FilterTerm("name", tuple(MatchArg("", n) for n in members)),)),) if members else ()
    return GroupSpec(
        name, filters=filters, subgroups=subgroups, has_filter_lines=bool(members or subgroups), **kw
    )


NODES = tuple(node(n) for n in ("a", "b", "c", "d"))
IDS = {n.name: n.id for n in NODES}


def layout(*groups: GroupSpec) -> GroupLayout:
    spec = Spec(nodes=NODES, groups=groups)
    clock = FakeClock()
    return layout_of(GroupManager.build(spec, build_outbounds(spec, clock)[0], clock=clock))


@dataclass
class States:
    """Leaf health by NodeId (every family alike)."""

    tcp: dict[uuid.UUID, bool] = field(default_factory=dict)
    udp: dict[uuid.UUID, bool] = field(default_factory=dict)

    def tcp_alive(self, node_id: uuid.UUID, family: Family) -> bool:
        return self.tcp.get(node_id, False)

    def udp_selectable(self, node_id: uuid.UUID, family: Family) -> bool:
        return self.udp.get(node_id, False)


# --- slot stores: the pinned map, or memory -------------------------------------------------


class MemoryStore:
    kind = "memory"

    def __init__(self) -> None:
        self.backend = MemorySlots()

    def read(self, key: SlotKey) -> bool:
        return self.backend.values.get(key, True)  # an unwritten slot is alive

    def restart(self) -> MemoryStore | None:
        return None  # memory does not outlive the process


class PinnedStore:
    """Writes through a Datapath; reads the pinned map through a separate fd, as another
    process (or the classifier) would."""

    kind = "bpf"

    def __init__(self, pin_dir: Path, object_path: Path) -> None:
        self.pin_dir, self.object_path = pin_dir, object_path
        self.datapath = Datapath.open((), pin_dir=str(pin_dir), object_path=object_path)
        assert self.datapath.kind == "bpf", self.datapath.reason
        self.backend = self.datapath.backend
        self.pinned = bpfmap.SlotMap(bpfmap.obj_get(str(pin_dir / MAP_ALIVE)))

    def read(self, key: SlotKey) -> bool:
        return self.pinned.get(slot_index(key)) == SLOT_ALIVE

    def close(self) -> None:
        if self.pinned is not None:
            os.close(self.pinned.fd)
            self.pinned = None
        self.datapath.close()

    def restart(self) -> PinnedStore:
        self.close()
        return PinnedStore(self.pin_dir, self.object_path)


@pytest.fixture(params=["memory", "bpf"])
def store(request, tmp_path) -> Iterator[MemoryStore | PinnedStore]:
    if request.param == "memory":
        yield MemoryStore()
        return
    require_bpf("eBPF datapath tests")
    with private_bpffs(tmp_path) as pin_dir:
        opened = PinnedStore(pin_dir, classifier_object(tmp_path))
        request.node.stores = [opened]
        yield opened
        for s in request.node.stores:
            s.close()


def every_slot(count: int) -> list[SlotKey]:
    return [SlotKey(o, n, f) for o in range(count) for n in SLOT_NETWORKS for f in SLOT_FAMILIES]


def snapshot(
    store, publisher: SlotPublisher, lay: GroupLayout
) -> tuple[dict[SlotKey, bool], dict[SlotKey, bool]]:
    """What the store holds for every slot of ``lay``, and what it must hold."""
    expected = {
        SlotKey(lay.ordinal(g), n, f): v for g in lay.groups for (n, f), v in publisher.values(lay, g).items()
    }
    return {key: store.read(key) for key in expected}, expected


# --- shared assertions --------------------------------------------------------------------------

NESTED = (group("top", subgroups=("mid",)), group("mid", "a", "b"), group("other", "c", "d"))


def test_slots_follow_leaf_transitions_through_nested_groups(store):
    states = States(tcp={IDS["a"]: True})
    publisher = SlotPublisher(store.backend, states)
    lay = layout(*NESTED)
    publisher.reload(lay, lambda: None)
    top, mid = (
        SlotKey(lay.ordinal("top"), Network.TCP, Family.V4),
        SlotKey(lay.ordinal("mid"), Network.TCP, Family.V4),
    )
    assert store.read(top) and store.read(mid)
    states.tcp[IDS["a"]] = False
    publisher.on_transition(IDS["a"])
    assert not store.read(top) and not store.read(mid)  # both ancestors recomputed
    assert not store.read(SlotKey(lay.ordinal("other"), Network.TCP, Family.V6))
    states.udp[IDS["b"]] = True
    publisher.on_transition(IDS["b"])
    assert store.read(SlotKey(lay.ordinal("top"), Network.UDP, Family.V6))
    actual, expected = snapshot(store, publisher, lay)
    assert actual == expected


def test_a_reload_is_fail_open_then_exact_and_a_restart_keeps_the_values(store, request):
    states = States(tcp={IDS["c"]: True}, udp={IDS["c"]: True})
    publisher = SlotPublisher(store.backend, states)
    old = layout(*NESTED)
    publisher.reload(old, lambda: None)
    assert not all(store.read(k) for k in every_slot(3))  # some slots are dead before the reload
    new = layout(group("other", "c", "d"), group("fresh", "d"), *NESTED[:2], group("late", "b"))
    seen: dict[SlotKey, bool] = {}
    publisher.reload(new, lambda: seen.update({k: store.read(k) for k in every_slot(5)}))
    assert seen and all(seen.values())  # the new generation was published over open slots
    actual, expected = snapshot(store, publisher, new)
    assert actual == expected and not all(expected.values())
    restarted = store.restart()
    if restarted is None:
        return
    request.node.stores.append(restarted)
    assert restarted.datapath.kind == "bpf"
    assert {key: restarted.read(key) for key in expected} == expected  # not refilled: the pin was reused


def test_a_new_map_reads_alive_everywhere_and_an_incompatible_pin_is_replaced(tmp_path, caplog):
    require_bpf("eBPF datapath tests")
    with private_bpffs(tmp_path) as pin_dir:
        pin_dir.mkdir()
        fd = bpfmap.map_create(bpfmap.BPF_MAP_TYPE_ARRAY, 4, 8, 3, "honk_alive")  # an older layout
        bpfmap.obj_pin(fd, str(pin_dir / MAP_ALIVE))
        os.close(fd)
        with caplog.at_level(logging.INFO, logger="honk.ebpf"):
            datapath = Datapath.open((), pin_dir=str(pin_dir), object_path=classifier_object(tmp_path))
        try:
            assert datapath.kind == "bpf"
            assert any("has another layout" in r.message for r in caplog.records)
            lines = [r.message for r in caplog.records if r.message.startswith("ebpf: kernel datapath")]
            assert lines == [f"ebpf: kernel datapath on no interface (pinned {pin_dir})"]
            assert all(
                datapath.backend.read(SlotKey(o, n, f))
                for o in (0, 7, 1023)
                for n in SLOT_NETWORKS
                for f in SLOT_FAMILIES
            )
            datapath.backend.write(SlotKey(5000, Network.TCP, Family.V4), False)  # beyond the map: ignored
        finally:
            datapath.close()


def test_without_bpffs_or_object_the_datapath_is_in_memory_and_says_why(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="honk.ebpf"):
        datapath = Datapath.open(("lan0",), pin_dir=str(tmp_path / "pins"), object_path=tmp_path / "absent.o")
    assert datapath.kind == "memory" and isinstance(datapath.backend, MemorySlots)
    (line,) = [r.message for r in caplog.records if r.message.startswith("ebpf:")]
    assert line.startswith("ebpf: in-memory slots only: ") and line.endswith(datapath.reason)
    datapath.set_rules(())
    assert datapath.counters() == (0, 0, 0)
    datapath.close(detach=True)


# --- the classifier on a veth ---------------------------------------------------------------------


@pytest.fixture
def testbed(tmp_path) -> Iterator[tuple[str, str]]:
    """(sender namespace, receiver namespace) joined by a veth, IPv4 and IPv6 addresses."""
    require_bpf("eBPF datapath tests")
    with scratch_netns("eBPF datapath tests") as sender, scratch_netns("eBPF datapath tests") as receiver:

        def ip(*args: str) -> None:
            subprocess.run(["ip", *args], check=True)

        ip("link", "add", "hks0", "netns", sender, "type", "veth", "peer", "name", "hkr0", "netns", receiver)
        for ns, dev, v4, v6 in (
            (sender, "hks0", SENDER_V4, SENDER_V6),
            (receiver, "hkr0", RECEIVER_V4, RECEIVER_V6),
        ):
            ip("-n", ns, "addr", "add", f"{v4}/24", "dev", dev)
            ip("-n", ns, "addr", "add", f"{v6}/64", "dev", dev, "nodad")
            ip("-n", ns, "link", "set", dev, "up")
            ip("-n", ns, "link", "set", "lo", "up")
        yield sender, receiver


def bound(kind: int, family: int, address: str, port: int) -> socket.socket:
    sock = socket.socket(family, kind)
    sock.bind((address, port))
    if kind == socket.SOCK_STREAM:
        sock.listen()
    sock.settimeout(RECEIVE_TIMEOUT)
    return sock


def sender_socket(family: int, kind: int = socket.SOCK_DGRAM) -> socket.socket:
    sock = socket.socket(family, kind)
    sock.settimeout(RECEIVE_TIMEOUT)
    return sock


@dataclass
class Receiver:
    data: socket.socket
    dns: socket.socket
    data6: socket.socket
    tcp: socket.socket
    direct: socket.socket

    def nothing_on(self, sock: socket.socket) -> bool:
        sock.setblocking(False)
        try:
            sock.recv(2048)
        except BlockingIOError:
            return True
        finally:
            sock.settimeout(RECEIVE_TIMEOUT)
        return False

    def close(self) -> None:
        for sock in (self.data, self.dns, self.data6, self.tcp, self.direct):
            sock.close()


def test_the_classifier_drops_only_a_dead_groups_traffic_and_never_dns(testbed, tmp_path):
    sender, receiver = testbed
    with private_bpffs(tmp_path) as pin_dir:
        obj = classifier_object(tmp_path)
        datapath = in_netns(receiver, lambda: Datapath.open(["hkr0"], pin_dir=str(pin_dir), object_path=obj))
        rx = in_netns(
            receiver,
            lambda: Receiver(
                bound(socket.SOCK_DGRAM, socket.AF_INET, RECEIVER_V4, DATA_PORT),
                bound(socket.SOCK_DGRAM, socket.AF_INET, RECEIVER_V4, DNS_PORT),
                bound(socket.SOCK_DGRAM, socket.AF_INET6, RECEIVER_V6, DATA_PORT),
                bound(socket.SOCK_STREAM, socket.AF_INET, RECEIVER_V4, TCP_PORT),
                bound(socket.SOCK_DGRAM, socket.AF_INET, RECEIVER_V4, DIRECT_PORT),
            ),
        )
        tx, tx6 = in_netns(sender, lambda: (sender_socket(socket.AF_INET), sender_socket(socket.AF_INET6)))
        try:
            assert datapath.kind == "bpf", datapath.reason
            lay = GroupLayout(("other", "g"), {})
            routing = RoutingSpec(
                (
                    RuleSpec((Predicate("dport", (MatchArg("", str(DIRECT_PORT)),)),), "direct"),
                    RuleSpec(
                        (Predicate("dip", (MatchArg("", RECEIVER_V4), MatchArg("", RECEIVER_V6))),), "g"
                    ),
                )
            )
            table = compile_kernel_rules(routing, lay)  # the default bypass leaves 198.51.100.0/24 alone
            assert table.rules == 2
            datapath.set_rules(table.entries)
            assert datapath.published_rules() == len(table.entries)
            g = lay.ordinal("g")
            udp4, udp6 = SlotKey(g, Network.UDP, Family.V4), SlotKey(g, Network.UDP, Family.V6)
            datapath.backend.write(udp4, False)
            before = datapath.counters()

            # dead: the datagram is dropped; DNS to the same group passes (and, sent after it,
            # proves the dropped one was already judged)
            tx.sendto(b"dropped", (RECEIVER_V4, DATA_PORT))
            tx.sendto(b"dns", (RECEIVER_V4, DNS_PORT))
            assert rx.dns.recv(64) == b"dns"
            assert rx.nothing_on(rx.data)
            after = datapath.counters()
            assert after.dropped - before.dropped == 1
            assert after.dns_passed - before.dns_passed == 1

            # the first matching rule decides: an earlier rule sends this port direct
            tx.sendto(b"direct", (RECEIVER_V4, DIRECT_PORT))
            assert rx.direct.recv(64) == b"direct"

            # the IPv6 slot is separate: alive, so IPv6 passes while IPv4 is dead
            tx6.sendto(b"v6", (RECEIVER_V6, DATA_PORT))
            assert rx.data6.recv(64) == b"v6"

            # alive again: it passes
            datapath.backend.write(udp4, True)
            tx.sendto(b"alive", (RECEIVER_V4, DATA_PORT))
            assert rx.data.recv(64) == b"alive"

            # IPv6 dead now; IPv4 stays alive
            datapath.backend.write(udp6, False)
            tx6.sendto(b"v6 dropped", (RECEIVER_V6, DATA_PORT))
            tx.sendto(b"dns again", (RECEIVER_V4, DNS_PORT))
            assert rx.dns.recv(64) == b"dns again"
            assert rx.nothing_on(rx.data6)
            assert datapath.counters().dropped - before.dropped == 2

            # TCP to the group: its TCP slot is alive, so the connection is made
            datapath.backend.write(SlotKey(g, Network.TCP, Family.V4), True)
            client = in_netns(sender, lambda: sender_socket(socket.AF_INET, socket.SOCK_STREAM))
            with client:
                client.connect((RECEIVER_V4, TCP_PORT))
                accepted, _ = rx.tcp.accept()
                accepted.close()
        finally:
            for sock in (tx, tx6):
                sock.close()
            rx.close()
            in_netns(receiver, lambda: datapath.close(detach=True))


def test_the_classifier_is_replaced_not_duplicated_and_detaches(testbed, tmp_path):
    _, receiver = testbed
    with private_bpffs(tmp_path) as pin_dir:
        obj = classifier_object(tmp_path)
        first = in_netns(receiver, lambda: Datapath.open(["hkr0"], pin_dir=str(pin_dir), object_path=obj))
        second = in_netns(receiver, lambda: Datapath.open(["hkr0"], pin_dir=str(pin_dir), object_path=obj))
        try:
            assert first.kind == second.kind == "bpf"
            filters = subprocess.run(
                ["ip", "netns", "exec", receiver, "tc", "filter", "show", "dev", "hkr0", "ingress"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            assert filters.count("handle 0x484b") == 1  # one honk filter, the second load's
            first.close()
            in_netns(receiver, lambda: second.close(detach=True))
            filters = subprocess.run(
                ["ip", "netns", "exec", receiver, "tc", "filter", "show", "dev", "hkr0", "ingress"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            assert "honk_tc" not in filters
            assert not in_netns(receiver, lambda: loader.detach_tc_ingress("hkr0"))  # nothing left to detach
        finally:
            first.close()
            second.close()


def test_a_rule_table_is_written_to_the_idle_bank_then_switched_and_survives_a_restart(tmp_path):
    require_bpf("eBPF datapath tests")
    lay = GroupLayout(("g",), {})
    first = compile_kernel_rules(
        RoutingSpec((RuleSpec((Predicate("dport", (MatchArg("", "80"),)),), "g"),)), lay, bypass=()
    ).entries
    second = compile_kernel_rules(
        RoutingSpec((RuleSpec((Predicate("l4proto", (MatchArg("", "udp"),)),), "g"), RuleSpec((), "direct"))),
        lay,
        bypass=(),
    ).entries
    with private_bpffs(tmp_path) as pin_dir:
        obj = classifier_object(tmp_path)
        datapath = Datapath.open((), pin_dir=str(pin_dir), object_path=obj)
        rules_fd = bpfmap.obj_get(str(pin_dir / MAP_RULES))
        meta_fd = bpfmap.obj_get(str(pin_dir / MAP_RULES_META))

        def entry(index: int) -> bytes:
            return bpfmap.map_lookup(rules_fd, struct.pack("=I", index), RULE_STRUCT.size)

        def meta() -> tuple[int, int]:
            value = struct.unpack("=Q", bpfmap.map_lookup(meta_fd, struct.pack("=I", 0), 8))[0]
            return value >> 32, value & 0xFFFFFFFF

        try:
            assert meta() == (0, 0)  # a new table: nothing published, everything passes
            datapath.set_rules(first)
            assert meta() == (1, 1) and entry(KERNEL_RULES_MAX) == first[0].pack()
            datapath.set_rules(second)
            assert meta() == (0, 2) and [entry(0), entry(1)] == [e.pack() for e in second]
            assert entry(KERNEL_RULES_MAX) == first[0].pack()  # the bank read before stayed whole
            with pytest.raises(ValueError):
                datapath.set_rules(first * (KERNEL_RULES_MAX + 1))
            assert meta() == (0, 2)
            datapath.close()
            datapath = Datapath.open((), pin_dir=str(pin_dir), object_path=obj)
            assert datapath.published_rules() == 2  # a restart keeps the published table
        finally:
            os.close(rules_fd)
            os.close(meta_fd)
            datapath.close()


def test_a_missing_bpffs_is_mounted_at_sys_fs_bpf(tmp_path):
    require_root("eBPF datapath tests")
    unshare = require_binary("unshare")
    script = (
        "from honk.ebpf.loader import ensure_bpffs, filesystem_of; "
        "print(ensure_bpffs('/sys/fs/bpf/honk'), ensure_bpffs('/sys/fs/bpf/honk'), filesystem_of('/sys/fs/bpf/honk'))"
    )
    # a private mount namespace: unmounting and mounting there leaves the host's /sys/fs/bpf alone
    result = subprocess.run(
        [
            unshare,
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f'while umount /sys/fs/bpf 2>/dev/null; do :; done; exec "{sys.executable}" -c "{script}"',
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    )
    assert result.stdout.split() == ["True", "False", "bpf"]
