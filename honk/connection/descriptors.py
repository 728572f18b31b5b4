"""File descriptors as a budget: flows may spend what the control plane does not need.

Every relayed flow holds descriptors (its client and its upstream socket, the engine's pipes
while it splices, a socketpair while it is bridged), and a burst of short connections against
a server that keeps its side open for a while can spend the whole process limit. When that
happens, ``accept`` fails everywhere at once: the API, health probes, DNS and reload stop with
the flows. So honk treats descriptors as a budget with two shares:

* at start the soft ``RLIMIT_NOFILE`` is raised to the hard limit (:func:`raise_descriptor_limit`):
  the soft limit is a default for ordinary programs, not what a router daemon needs;
* :data:`~honk.outbound.admission.RESERVED_DESCRIPTORS` of them are the control plane's
  reserve, which flows never take: a new flow is admitted only while the descriptors in use
  plus the flow's own (:data:`FLOW_DESCRIPTORS`) stay below the limit minus the reserve;
* a refused flow is refused at once and cleanly by its inbound (SOCKS5 ``0x01``, HTTP 503, a
  reset for a transparent flow) as a :class:`DescriptorsExhausted`, a ``CapacityRefused``: it
  is counted (``honk_descriptor_refusals_total``), a warning is logged at most once per
  :data:`REFUSAL_WARN_INTERVAL`, and no node is charged for it (nothing was dialled).

What is in use is counted, not assumed: ``/proc/self/fd`` is listed at most every
:data:`RECOUNT_INTERVAL` seconds of the injected clock (a listing of a thousand descriptors
costs about 0.4 ms). Between counts the guess adds :data:`FLOW_DESCRIPTORS` for each flow
admitted since and takes them off for each flow that ended since (the connection tracker's
count of removed flows): a flow admitted but never tracked (its dial failed) keeps counting
until the next count, so the guess errs high, never low. A flow the guess would refuse
triggers a fresh count first, at most every :data:`RECOUNT_MIN_GAP` seconds.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
from collections.abc import Callable

from honk.core.clock import Clock
from honk.core.errors import CapacityRefused
from honk.core.logs import kv
from honk.core.stats import RuntimeStats
from honk.outbound.admission import DESCRIPTORS_IF_UNLIMITED, RESERVED_DESCRIPTORS

__all__ = [
    "FLOW_DESCRIPTORS",
    "RECOUNT_INTERVAL",
    "RECOUNT_MIN_GAP",
    "REFUSAL_WARN_INTERVAL",
    "DescriptorBudget",
    "DescriptorsExhausted",
    "UNCOUNTABLE",
    "count_open_descriptors",
    "raise_descriptor_limit",
]

FLOW_DESCRIPTORS = 2  # honk's choice: a new flow is about to hold its client and its upstream socket
RECOUNT_INTERVAL = 0.25  # seconds: the descriptors in use are recounted at most this often (clock time)
RECOUNT_MIN_GAP = 0.02  # seconds: a flow the guess would refuse recounts first, at most this often
REFUSAL_WARN_INTERVAL = 10.0  # seconds between two "descriptor budget spent" warnings

log = logging.getLogger("honk.connection")


class DescriptorsExhausted(CapacityRefused):
    """The flows' share of the descriptor limit is spent: the flow was refused before any dial."""


UNCOUNTABLE = -1  # count_open_descriptors: there is no /proc/self/fd to count (a chroot without /proc)


def count_open_descriptors() -> int:
    """How many descriptors this process holds now (``/proc/self/fd``, less the listing's own);
    :data:`UNCOUNTABLE` without ``/proc``. A listing that finds no descriptor to open the
    directory with says so by raising (the budget then counts everything as spent)."""
    try:
        return len(os.listdir("/proc/self/fd")) - 1
    except OSError as exc:
        if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOMEM):
            raise
        return UNCOUNTABLE


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise the soft ``RLIMIT_NOFILE`` to the hard limit; (soft before, soft now)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError):  # an unlimited hard limit above the kernel's nr_open: keep the soft one
        return soft, soft
    log.debug("descriptor limit raised %s", kv(soft_before=soft, soft=hard))
    return soft, hard


def _soft_limit() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return DESCRIPTORS_IF_UNLIMITED if soft == resource.RLIM_INFINITY else soft


class DescriptorBudget:
    """The flows' share of the descriptor limit (one per process; see the module docstring)."""

    def __init__(
        self,
        clock: Clock,
        *,
        limit: int | None = None,
        reserve: int = RESERVED_DESCRIPTORS,
        counter: Callable[[], int] = count_open_descriptors,
        stats: RuntimeStats | None = None,
        ended: Callable[[], int] | None = None,
    ) -> None:
        self.clock = clock
        self._ended = ended or (lambda: 0)  # flows ended since start (ConnectionTracker.removed)
        self._ended_at_count = 0
        self.stats = stats  # told each refusal (/metrics honk_descriptor_refusals_total)
        self.limit = limit if limit is not None else _soft_limit()
        self.reserve = min(reserve, self.limit // 2)  # a tiny limit still leaves flows half of it
        self._counter = counter
        self._counted = 0  # descriptors in use at the last count
        self._counted_at: float | None = None  # clock time of the last count
        self._since = 0  # flows admitted since the last count
        self.refused = 0  # flows refused, ever
        self._uncountable = False  # warned that there is no /proc/self/fd to count
        self._refused_unwarned = 0  # refused since the last warning
        self._warned_at: float | None = None

    @property
    def flow_share(self) -> int:
        """Descriptors flows may hold together."""
        return self.limit - self.reserve

    def in_use(self) -> int:
        """The current guess of descriptors in use (a count plus what was admitted since)."""
        if self._uncountable:
            return 0
        ended = self._ended() - self._ended_at_count
        return max(0, self._counted + (self._since - ended) * FLOW_DESCRIPTORS)

    def _recount(self, now: float) -> None:
        try:
            counted = self._counter()
        except OSError:  # not even a descriptor to count with: spent
            counted = self.limit
        if counted == UNCOUNTABLE:
            if not self._uncountable:
                log.warning("descriptor budget off: /proc/self/fd cannot be read, flows are not limited")
                self._uncountable = True
            counted = 0  # honk cannot see its descriptors: it does not refuse on a guess
        self._counted = counted
        self._counted_at = now
        self._since = 0
        self._ended_at_count = self._ended()

    def admit(self) -> bool:
        """Whether a new flow may start now; an admitted flow counts until the next count."""
        now = self.clock.now()
        if self._counted_at is None or now - self._counted_at >= RECOUNT_INTERVAL:
            self._recount(now)
        share = self.flow_share
        if self.in_use() + FLOW_DESCRIPTORS > share:
            if now - self._counted_at >= RECOUNT_MIN_GAP:
                self._recount(now)  # the guess would refuse: flows may have ended since the count
            if self.in_use() + FLOW_DESCRIPTORS > share:
                self._note_refusal(now)
                return False
        self._since += 1
        return True

    def refusal(self, what: str) -> DescriptorsExhausted:
        """The error for a flow :meth:`admit` refused, naming ``what`` (built only when refused:
        admission is on every flow's path)."""
        return DescriptorsExhausted(
            f"{what}: refused, the descriptor budget for flows is spent "
            f"({self.in_use()} of {self.limit} in use, {self.reserve} kept for the control plane)"
        )

    def _note_refusal(self, now: float) -> None:
        self.refused += 1
        if self.stats is not None:
            self.stats.descriptor_refusals += 1
        self._refused_unwarned += 1
        if self._warned_at is None or now - self._warned_at >= REFUSAL_WARN_INTERVAL:
            log.warning(
                "descriptor budget spent, refusing new flows %s",
                kv(
                    refused=self._refused_unwarned,
                    in_use=self.in_use(),
                    limit=self.limit,
                    reserve=self.reserve,
                ),
            )
            self._warned_at = now
            self._refused_unwarned = 0
