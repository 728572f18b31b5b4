"""Dial admission: how many physical dials and protocol carriers may be in flight at once.

A reload storm, a probe burst or a sudden fan-out of flows would otherwise open sockets
until the process runs out of file descriptors. Admission has two layers:

* every configuration generation owns a :class:`DialBudget` (``max_concurrent_dials``,
  64 by default), so a reload can give the new generation another limit without
  touching the old generation's dials still in flight;
* all generations share one process-wide dial gate, sized once per process from the
  descriptor limit (:func:`process_gates`). A budget's limit is clamped to it, and an
  admitted dial holds one slot of its budget *and* one of the gate, so overlapping
  generations can never exceed the gate together.

Mux.Cool/VLESS carriers are long-lived physical streams; each holds a slot of a
separate process carrier gate (:meth:`ProcessGates.carrier_permit`) for its whole
life, idle phases included, until it is torn down.

A deadline that passes while an acquisition is still waiting is a *local capacity
refusal* (:class:`~honk.core.errors.CapacityRefused`): nothing was sent upstream, so
it is not an upstream timeout and must not be retried as one. A waiter that gives up
(deadline or cancellation) removes its own registration at once; a slot released
later goes to the next waiter, never to the one that left. Waiters are served in
arrival order.

When the caller's own deadline scope (with the same deadline) interrupts the wait
first, the permit call sees a cancellation, not its deadline; an
:class:`AdmissionWatch` passed in (or the scope returned by :meth:`DialBudget.permit`)
then says whether the acquisition was still pending, so the caller can classify its
``TimeoutError`` as a capacity refusal.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import resource
from collections import deque

from honk.config.spec import DEFAULT_MAX_CONCURRENT_DIALS
from honk.core.clock import Clock, timeout_at
from honk.core.errors import CapacityRefused

__all__ = [
    "CARRIER_DESCRIPTOR_SHARE",
    "DEFAULT_MAX_CONCURRENT_DIALS",
    "DESCRIPTORS_IF_UNLIMITED",
    "DESCRIPTORS_PER_DIAL",
    "MAX_CARRIER_GATE",
    "MIN_CARRIER_GATE",
    "MIN_DIAL_GATE",
    "RESERVED_DESCRIPTORS",
    "AdmissionWatch",
    "CarrierPermit",
    "DialBudget",
    "DialPermit",
    "PermitScope",
    "ProcessGates",
    "gate_sizes",
    "process_gates",
]

# The design leaves the gate computation open ("underspecified: how the descriptor gate is
# computed, e.g. from the file-descriptor limit"; "underspecified: the gate's size"). honk's choice:
RESERVED_DESCRIPTORS = 256  # honk's choice: kept back for listeners, logs, the state database, relays
DESCRIPTORS_PER_DIAL = 2  # honk's choice: an in-flight dial may hold a client and an upstream socket
MIN_DIAL_GATE = 16  # honk's choice: never fewer dial slots than this, however low the limit
CARRIER_DESCRIPTOR_SHARE = 4  # honk's choice: carriers may use a quarter of the unreserved descriptors
MIN_CARRIER_GATE = 8  # honk's choice: the smallest carrier gate
MAX_CARRIER_GATE = 256  # honk's choice: the largest carrier gate, whatever the limit
DESCRIPTORS_IF_UNLIMITED = 1 << 20  # honk's choice: what an unlimited RLIMIT_NOFILE counts as


def gate_sizes(soft_limit: int) -> tuple[int, int]:
    """The (dial gate, carrier gate) sizes for a soft ``RLIMIT_NOFILE`` of ``soft_limit``."""
    if soft_limit < 0 or soft_limit == resource.RLIM_INFINITY:
        soft_limit = DESCRIPTORS_IF_UNLIMITED
    spare = max(0, soft_limit - RESERVED_DESCRIPTORS)
    dials = max(MIN_DIAL_GATE, spare // DESCRIPTORS_PER_DIAL)
    carriers = min(MAX_CARRIER_GATE, max(MIN_CARRIER_GATE, spare // CARRIER_DESCRIPTOR_SHARE))
    return dials, carriers


class _Gate:
    """A counting gate with FIFO waiters; a waiter that leaves takes its registration with it."""

    __slots__ = ("size", "held", "_waiters")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("a gate needs at least one slot")
        self.size = size
        self.held = 0  # slots granted and not yet given back
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return sum(1 for fut in self._waiters if not fut.done())

    def try_take(self) -> bool:
        """Take a slot now if one is free and nobody queues before us."""
        while self._waiters and self._waiters[0].done():
            self._waiters.popleft()  # a waiter that left and has not yet withdrawn itself
        if self.held < self.size and not self._waiters:
            self.held += 1
            return True
        return False

    async def take(self) -> None:
        """Wait for a slot in arrival order."""
        if self.try_take():
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.give_back()  # the slot reached us as we were interrupted: pass it on
            else:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(fut)
            raise

    def give_back(self) -> None:
        """Return a slot: the first live waiter gets it, otherwise it becomes free."""
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # handed over: ``held`` stays the same
                return
        self.held -= 1


class AdmissionWatch:
    """What became of one acquisition, for a caller whose own deadline scope may interrupt it.

    ``pending`` is true while the acquisition waits for a slot; ``interrupted`` becomes
    true when it ended without a permit while pending (its deadline, or a cancellation such
    as the caller's own deadline scope). A caller that gets ``TimeoutError`` from its scope
    reports a capacity refusal when ``interrupted`` is set (GH-J-07).
    """

    __slots__ = ("pending", "interrupted")

    def __init__(self) -> None:
        self.pending = False
        self.interrupted = False


class _DialGate:
    """The process dial gate: a slot count shared by every generation's budget.

    Waiters queue on their own budget; when slots free up, the gate grants them in
    arrival order among the budgets that have room, so an old generation stuck at its own
    limit does not hold back a new generation, and nobody overtakes an earlier waiter
    that could have been served.
    """

    __slots__ = ("size", "held", "_queued", "_seq")

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("a gate needs at least one slot")
        self.size = size
        self.held = 0
        self._queued: set[DialBudget] = set()  # budgets with at least one registration
        self._seq = itertools.count()

    @property
    def waiting(self) -> int:
        return sum(budget.waiting for budget in self._queued)

    def enqueue(self, budget: DialBudget, fut: asyncio.Future[None]) -> None:
        budget._queue.append((next(self._seq), fut))
        self._queued.add(budget)

    def withdraw(self, budget: DialBudget, fut: asyncio.Future[None]) -> None:
        """Remove a registration that gave up; a later grant can never reach it."""
        for entry in budget._queue:
            if entry[1] is fut:
                budget._queue.remove(entry)
                break
        if not budget._queue:
            self._queued.discard(budget)

    def dispatch(self) -> None:
        """Hand free slots to waiters: the earliest arrival whose budget has room goes first."""
        while self.held < self.size:
            best: DialBudget | None = None
            for budget in list(self._queued):
                queue = budget._queue
                while queue and queue[0][1].done():
                    queue.popleft()  # cancelled, not yet withdrawn
                if not queue:
                    self._queued.discard(budget)
                elif budget._held < budget.effective_limit and (
                    best is None or queue[0][0] < best._queue[0][0]
                ):
                    best = budget
            if best is None:
                return
            _, fut = best._queue.popleft()
            if not best._queue:
                self._queued.discard(best)
            best._held += 1
            self.held += 1
            fut.set_result(None)


class ProcessGates:
    """The process-wide dial gate and carrier gate, shared by every generation.

    Built once per process by :func:`process_gates`; tests build their own with
    explicit sizes. Missing sizes come from the soft ``RLIMIT_NOFILE`` (:func:`gate_sizes`).
    """

    def __init__(self, dial_gate: int | None = None, carrier_gate: int | None = None) -> None:
        if dial_gate is None or carrier_gate is None:
            soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            dials, carriers = gate_sizes(soft)
            dial_gate = dials if dial_gate is None else dial_gate
            carrier_gate = carriers if carrier_gate is None else carrier_gate
        self.dials = _DialGate(dial_gate)
        self.carriers = _Gate(carrier_gate)

    @property
    def dial_size(self) -> int:
        return self.dials.size

    @property
    def carrier_size(self) -> int:
        return self.carriers.size

    @property
    def dials_in_use(self) -> int:
        """Dial permits held by every generation together."""
        return self.dials.held

    @property
    def dials_waiting(self) -> int:
        """Dial acquisitions of every generation still waiting."""
        return self.dials.waiting

    @property
    def carriers_in_use(self) -> int:
        """Carrier permits held right now."""
        return self.carriers.held

    @property
    def carriers_waiting(self) -> int:
        return self.carriers.waiting

    async def carrier_permit(
        self, deadline: float, *, clock: Clock, watch: AdmissionWatch | None = None
    ) -> CarrierPermit:
        """A carrier slot, held until :meth:`CarrierPermit.release`; :class:`CapacityRefused`
        when ``deadline`` (absolute, on ``clock``) passes while still waiting."""
        gate = self.carriers
        if gate.try_take():
            return CarrierPermit(gate)
        watch = watch if watch is not None else AdmissionWatch()
        watch.pending = True
        try:
            async with timeout_at(clock, deadline):
                await gate.take()
        except BaseException as exc:
            watch.interrupted = True
            if isinstance(exc, TimeoutError):
                raise CapacityRefused("carrier admission: no carrier slot before the deadline") from None
            raise
        finally:
            watch.pending = False
        return CarrierPermit(gate)


class CarrierPermit:
    """One carrier's slot of the process carrier gate; :meth:`release` is idempotent."""

    __slots__ = ("_gate",)

    def __init__(self, gate: _Gate) -> None:
        self._gate: _Gate | None = gate

    @property
    def released(self) -> bool:
        return self._gate is None

    def release(self) -> None:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.give_back()


_process_gates: ProcessGates | None = None


def process_gates() -> ProcessGates:
    """The process's gates, sized from the descriptor limit at first use and never again."""
    global _process_gates
    if _process_gates is None:
        _process_gates = ProcessGates()
    return _process_gates


class DialBudget:
    """One generation's physical-dial admission: ``limit`` concurrent dials, clamped to the
    process dial gate; an admitted dial counts against both."""

    def __init__(self, limit: int, clock: Clock, gates: ProcessGates | None = None) -> None:
        if limit < 1:
            raise ValueError("max_concurrent_dials must be at least 1")
        self.limit = limit
        self.clock = clock
        self.gates = gates if gates is not None else process_gates()
        self.effective_limit = min(limit, self.gates.dial_size)
        self._held = 0
        self._queue: deque[tuple[int, asyncio.Future[None]]] = deque()  # (arrival, waiter)

    @property
    def in_use(self) -> int:
        """Permits of this generation held right now."""
        return self._held

    @property
    def waiting(self) -> int:
        """Acquisitions of this generation still waiting for a permit."""
        return sum(1 for _, fut in self._queue if not fut.done())

    def permit(self, deadline: float, watch: AdmissionWatch | None = None) -> PermitScope:
        """``async with budget.permit(deadline):`` holds one dial permit for the block."""
        return PermitScope(self, deadline, watch)

    def try_acquire(self) -> DialPermit | None:
        """A permit at once, or None when taking one would mean waiting."""
        gate = self.gates.dials
        # whenever both have room nobody of this budget waits (a release dispatches at once),
        # so taking the slot here overtakes no one
        if self._held < self.effective_limit and gate.held < gate.size and not self._queue:
            self._held += 1
            gate.held += 1
            return DialPermit(self)
        return None

    async def acquire(self, deadline: float, watch: AdmissionWatch | None = None) -> DialPermit:
        """A permit held until :meth:`DialPermit.release`; :class:`CapacityRefused` when
        ``deadline`` (absolute, on the budget's clock) passes while still waiting."""
        permit = self.try_acquire()
        if permit is not None:
            return permit
        gate = self.gates.dials
        watch = watch if watch is not None else AdmissionWatch()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        gate.enqueue(self, fut)
        gate.dispatch()  # a leftover of a vanished waiter may have kept us off the fast path
        watch.pending = True
        try:
            async with timeout_at(self.clock, deadline):
                await fut
        except BaseException as exc:
            if fut.done() and not fut.cancelled():
                self._release()  # granted as we were interrupted: pass the slot on
            else:
                gate.withdraw(self, fut)
            watch.interrupted = True
            if isinstance(exc, TimeoutError):
                raise CapacityRefused("dial admission: no dial slot before the deadline") from None
            raise
        finally:
            watch.pending = False
        return DialPermit(self)

    def _release(self) -> None:
        self._held -= 1
        gate = self.gates.dials
        gate.held -= 1
        gate.dispatch()


class DialPermit:
    """One admitted dial's slots (its budget's and the process gate's); :meth:`release` is idempotent."""

    __slots__ = ("_budget",)

    def __init__(self, budget: DialBudget) -> None:
        self._budget: DialBudget | None = budget

    @property
    def released(self) -> bool:
        return self._budget is None

    def release(self) -> None:
        budget, self._budget = self._budget, None
        if budget is not None:
            budget._release()


class PermitScope:
    """The async context manager of :meth:`DialBudget.permit`; ``watch`` tells whether the
    acquisition was interrupted while pending (for the caller's timeout classification)."""

    __slots__ = ("_budget", "_deadline", "watch", "_permit")

    def __init__(self, budget: DialBudget, deadline: float, watch: AdmissionWatch | None) -> None:
        self._budget = budget
        self._deadline = deadline
        self.watch = watch if watch is not None else AdmissionWatch()
        self._permit: DialPermit | None = None

    async def __aenter__(self) -> DialPermit:
        self._permit = await self._budget.acquire(self._deadline, self.watch)
        return self._permit

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        if self._permit is not None:
            self._permit.release()
        return False
