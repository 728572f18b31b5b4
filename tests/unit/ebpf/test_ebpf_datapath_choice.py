"""Which datapath honk gets and the one line that says why; the slot numbering the classifier
shares; the in-memory datapath's rule table."""

from __future__ import annotations

import errno
import logging

import pytest

from honk.alive.outcome import Family
from honk.core.net import Network
from honk.ebpf import datapath as datapath_module
from honk.ebpf.datapath import Datapath, slot_index
from honk.ebpf.kernel_rules import KERNEL_RULES_MAX, L4_ANY, NOT_A_GROUP, KernelRule
from honk.ebpf.slots import MemorySlots, SlotKey


def refuse(*_args, **_kw):
    raise PermissionError(errno.EPERM, "Operation not permitted")


def test_without_bpf_privileges_the_slots_live_in_memory_and_one_line_says_why(monkeypatch, caplog, tmp_path):
    monkeypatch.setattr(datapath_module.bpfmap, "map_create", refuse)
    with caplog.at_level(logging.DEBUG, logger="honk.ebpf"):
        datapath = Datapath.open(["lan0"], pin_dir=str(tmp_path))
    assert (datapath.kind, type(datapath.backend)) == ("memory", MemorySlots)
    assert [r.getMessage() for r in caplog.records] == [
        "ebpf: in-memory slots only: bpf(2) not permitted (Operation not permitted; needs root or CAP_BPF)"
    ]


def test_slots_are_numbered_group_network_family():
    assert slot_index(SlotKey(0, Network.TCP, Family.V4)) == 0
    assert slot_index(SlotKey(0, Network.TCP, Family.V6)) == 1
    assert slot_index(SlotKey(0, Network.UDP, Family.V4)) == 2
    assert slot_index(SlotKey(3, Network.UDP, Family.V6)) == 15


def test_the_memory_datapath_keeps_the_rules_and_refuses_an_oversized_table():
    datapath = Datapath.memory("tests")
    entry = KernelRule(0, 0, None, L4_ANY, 0, 65535, NOT_A_GROUP)
    datapath.set_rules([entry])
    assert datapath.rules == (entry,) and datapath.published_rules() == 1
    with pytest.raises(ValueError):
        datapath.set_rules([entry] * (KERNEL_RULES_MAX + 1))
    assert datapath.rules == (entry,)
    datapath.close(detach=True)
