"""The kernel datapath, or its in-memory stand-in: where group slots and kernel rules go.

:meth:`Datapath.open` picks the backend once at startup and says which in one log line:

* ``bpf``: bpf(2) works, a bpffs holds the pin directory (mounted at ``/sys/fs/bpf`` when
  missing), libbpf1 loads the compiled classifier (``datapath.bpf.o``) with its maps pinned
  there (reused across restarts), and the classifier is attached to every LAN interface's
  tc ingress. Slots are written to the pinned ``honk_alive`` map, rules to ``honk_rules``.
* ``memory``: anything above failed (no privileges, no bpffs, no object, no libbpf, a
  refused load or attach); slots live in a :class:`~honk.ebpf.slots.MemorySlots` and the
  rules are only kept. Userspace selection refuses what it must either way: the kernel
  datapath only refuses earlier (GH-H-04).

Slot encoding: ``slot = ordinal * 4 + network * 2 + family`` (TCP 0, UDP 1; V4 0, V6 1), value
1 alive and 0 dead. Fail-open: a map this process creates is filled with 1 before anything
is attached, so an unwritten slot reads alive; ordinals beyond the map are not written and
the classifier passes them.

Rule table: two banks; :meth:`Datapath.set_rules` writes the bank the classifier is not
reading, then switches ``honk_rules_meta`` (bank and count) with one element write, so the
classifier never reads a half-written table. On a reload, call it from the ``publish``
callback of :meth:`~honk.ebpf.slots.SlotPublisher.reload`: every old-or-new slot is alive
at that moment, so the switch from the old ordinals to the new ones cannot drop anything.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from honk._fast import bpfmap
from honk.alive.outcome import Family
from honk.core.net import Network
from honk.ebpf import loader
from honk.ebpf.kernel_rules import KERNEL_RULES_MAX, KernelRule
from honk.ebpf.slots import MemorySlots, SlotBackend, SlotKey

log = logging.getLogger("honk.ebpf")

SLOTS_PER_GROUP = 4  # networks (TCP, UDP) x families (V4, V6)
SLOT_ALIVE, SLOT_DEAD = 1, 0
MAP_ALIVE = "honk_alive"
MAP_RULES = "honk_rules"
MAP_RULES_META = "honk_rules_meta"
MAP_STATS = "honk_stats"
PROGRAM = "honk_tc"
STAT_PASSED, STAT_DROPPED, STAT_DNS_PASSED = 0, 1, 2
RULE_BANKS = 2
BANK_SHIFT = 32  # honk_rules_meta[0] = bank << 32 | count
COUNT_MASK = 0xFFFFFFFF
POSSIBLE_CPUS = "/sys/devices/system/cpu/possible"
U32 = struct.Struct("=I")
U64 = struct.Struct("=Q")

_NETWORK_INDEX = {Network.TCP: 0, Network.UDP: 1}
_FAMILY_INDEX = {Family.V4: 0, Family.V6: 1}


def slot_index(key: SlotKey) -> int:
    return key.ordinal * SLOTS_PER_GROUP + _NETWORK_INDEX[key.network] * 2 + _FAMILY_INDEX[key.family]


class BpfSlots:
    """The slot backend on the pinned ``honk_alive`` map (``u32 -> u64``)."""

    def __init__(self, fd: int) -> None:
        self.map = bpfmap.SlotMap(fd)
        self.capacity = bpfmap.map_info(fd).max_entries  # slots
        self._skipped = False

    def write(self, key: SlotKey, alive: bool) -> None:
        slot = slot_index(key)
        if slot >= self.capacity:
            if not self._skipped:  # the classifier passes these: fail-open by construction
                log.warning(
                    "ebpf: group ordinal %d has no slot (the map holds %d groups); it is never "
                    "refused in the kernel",
                    key.ordinal,
                    self.capacity // SLOTS_PER_GROUP,
                )
                self._skipped = True
            return
        self.map.set(slot, SLOT_ALIVE if alive else SLOT_DEAD)

    def read(self, key: SlotKey) -> bool:
        return self.map.get(slot_index(key)) != SLOT_DEAD

    def fill(self, value: int = SLOT_ALIVE) -> None:
        for slot in range(self.capacity):
            self.map.set(slot, value)


class Counters(NamedTuple):
    """What the classifier did, summed over CPUs."""

    passed: int
    dropped: int
    dns_passed: int


def possible_cpus() -> int:
    """How many values a per-CPU map answers (``0-3`` or ``0-1,4-5`` style ranges)."""
    with open(POSSIBLE_CPUS, encoding="ascii") as f:
        total = 0
        for part in f.read().strip().split(","):
            low, _, high = part.partition("-")
            total += (int(high) if high else int(low)) - int(low) + 1
    return total


class _Unavailable(Exception):
    """Why the kernel datapath cannot be used."""


class Datapath:
    """Slots and kernel rules for the datapath, on BPF maps or in memory."""

    def __init__(
        self,
        kind: str,
        backend: SlotBackend,
        *,
        reason: str = "",
        interfaces: tuple[str, ...] = (),
        pin_dir: str | None = None,
        obj: loader.BpfObject | None = None,
    ) -> None:
        self.kind = kind  # "bpf" | "memory"
        self.backend = backend
        self.reason = reason  # why "memory"
        self.interfaces = interfaces  # where the classifier is attached
        self.pin_dir = pin_dir
        self.rules: tuple[KernelRule, ...] = ()  # the last table set
        self._obj = obj
        self._rules_fd = obj.map_fd(MAP_RULES) if obj is not None else -1
        self._meta_fd = obj.map_fd(MAP_RULES_META) if obj is not None else -1
        self._stats_fd = obj.map_fd(MAP_STATS) if obj is not None else -1

    # --- opening ------------------------------------------------------------------------

    @classmethod
    def memory(cls, reason: str = "") -> Datapath:
        return cls("memory", MemorySlots(), reason=reason)

    @classmethod
    def open(
        cls,
        lan_interfaces: Iterable[str],
        *,
        pin_dir: str = loader.DEFAULT_PIN_DIR,
        object_path: str | os.PathLike[str] | None = None,
    ) -> Datapath:
        """The BPF datapath when everything it needs works, else the in-memory one; logs which."""
        interfaces = tuple(lan_interfaces)
        try:
            datapath, note = cls._open_bpf(interfaces, pin_dir, object_path)
        except _Unavailable as exc:
            log.info("ebpf: in-memory slots only: %s", exc)
            return cls.memory(str(exc))
        where = ", ".join(interfaces) if interfaces else "no interface"
        log.info("ebpf: kernel datapath on %s (pinned %s%s)", where, pin_dir, note)
        return datapath

    @classmethod
    def _open_bpf(
        cls, interfaces: tuple[str, ...], pin_dir: str, object_path: str | os.PathLike[str] | None
    ) -> tuple[Datapath, str]:
        _probe_bpf()
        path = object_path if object_path is not None else loader.default_object_path()
        if path is None or not os.path.isfile(path):
            raise _Unavailable(
                f"no compiled classifier ({path or 'honk/ebpf/datapath.bpf.o'}; `make build` compiles it)"
            )
        try:
            loader.libbpf()
        except OSError as exc:
            raise _Unavailable(f"libbpf1 is not installed ({exc})") from None
        try:
            mounted = loader.ensure_bpffs(pin_dir)
        except OSError as exc:
            raise _Unavailable(f"no bpffs for {pin_dir} ({exc.strerror or exc})") from None
        try:
            obj = loader.BpfObject.load(path, pin_dir)
        except OSError as exc:
            raise _Unavailable(f"loading {path} failed: {exc.strerror or exc}") from None
        attached: list[str] = []
        try:
            slots = BpfSlots(obj.map_fd(MAP_ALIVE))
            if MAP_ALIVE in obj.created:
                slots.fill(SLOT_ALIVE)  # before any classifier reads it
            program = obj.program_fd(PROGRAM)
            for interface in interfaces:
                loader.attach_tc_ingress(interface, program)
                attached.append(interface)
        except OSError as exc:
            for interface in attached:
                _detach_quietly(interface)
            obj.close()
            raise _Unavailable(f"setting up the classifier failed: {exc.strerror or exc}") from None
        note = f"; mounted a bpffs at {loader.BPFFS_ROOT}" if mounted else ""
        return cls("bpf", slots, interfaces=interfaces, pin_dir=pin_dir, obj=obj), note

    # --- rules ----------------------------------------------------------------------------

    def set_rules(self, entries: Sequence[KernelRule]) -> None:
        """Publish a new kernel rule table (at most KERNEL_RULES_MAX entries).

        A failed write leaves the classifier on the previous table, or, if even the switch
        failed, tries to publish an empty one (everything passes); the error is raised."""
        entries = tuple(entries)
        if len(entries) > KERNEL_RULES_MAX:
            raise ValueError(f"{len(entries)} kernel rules; the table holds {KERNEL_RULES_MAX}")
        if self._obj is not None:
            self._write_table(entries)
        self.rules = entries

    def _write_table(self, entries: tuple[KernelRule, ...]) -> None:
        active = self._meta() >> BANK_SHIFT & 1
        bank = 1 - active
        for i, entry in enumerate(entries):  # a failure here: the classifier still reads the old bank
            bpfmap.map_update(self._rules_fd, U32.pack(bank * KERNEL_RULES_MAX + i), entry.pack())
        try:
            bpfmap.map_update(self._meta_fd, U32.pack(0), U64.pack(bank << BANK_SHIFT | len(entries)))
        except OSError:
            try:
                bpfmap.map_update(self._meta_fd, U32.pack(0), U64.pack(active << BANK_SHIFT))
            except OSError as exc:
                log.warning("ebpf: the kernel rule table could not be emptied either error=%s", exc)
            raise

    def _meta(self) -> int:
        return U64.unpack(bpfmap.map_lookup(self._meta_fd, U32.pack(0), U64.size))[0]

    def published_rules(self) -> int:
        """How many entries the classifier reads now (the rules kept, in memory)."""
        if self._obj is None:
            return len(self.rules)
        return self._meta() & COUNT_MASK

    # --- counters -------------------------------------------------------------------------

    def counters(self) -> Counters:
        if self._obj is None:
            return Counters(0, 0, 0)
        cpus = possible_cpus()
        sums = []
        for stat in (STAT_PASSED, STAT_DROPPED, STAT_DNS_PASSED):
            raw = bpfmap.map_lookup(self._stats_fd, U32.pack(stat), U64.size * cpus)
            sums.append(sum(value for (value,) in U64.iter_unpack(raw)))
        return Counters(*sums)

    # --- closing ----------------------------------------------------------------------------

    def close(self, detach: bool = False) -> None:
        """Release the maps' fds (the pins stay). ``detach``: also take the classifier off the
        interfaces; otherwise it keeps filtering with the pinned maps after honk exits."""
        if self._obj is None:
            return
        if detach:
            for interface in self.interfaces:
                _detach_quietly(interface)
        self._obj.close()
        self._obj = None


def _probe_bpf() -> None:
    try:
        fd = bpfmap.map_create(bpfmap.BPF_MAP_TYPE_ARRAY, U32.size, U64.size, 1, b"honk_probe")
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.EACCES):
            raise _Unavailable(
                f"bpf(2) not permitted ({os.strerror(exc.errno)}; needs root or CAP_BPF)"
            ) from None
        raise _Unavailable(f"bpf(2) unavailable ({os.strerror(exc.errno or errno.ENOSYS)})") from None
    os.close(fd)


def _detach_quietly(interface: str) -> None:
    try:
        loader.detach_tc_ingress(interface)
    except OSError as exc:
        log.warning("ebpf: detaching from %s failed error=%s", interface, exc)
