"""When probes run: the periodic cycle, the recovery scheduler, emergency and network-change probes.

Theory of operation
-------------------
The runner turns the health state's needs into probe *jobs* and runs them with at
most ``concurrency`` in flight (the probe admission bound). A job is one
measurement: TCP of a node over one family, UDP (DNS, plus the QUIC handshake
for Score leaves) of a node over one family, or one member of a group's
``check_url``. Jobs wait in one queue; a small set of worker tasks drain it, so
a cycle over thousands of nodes costs one queue entry per job, not one task.

* The periodic loop wakes every ``check_interval`` and queues a TCP and a UDP job
  per wanted node and family, skipping dead states (the recovery scheduler owns
  those, so their cooldown holds) and jobs already queued or running.
* The recovery loop wakes every ``min(5 s, check_interval)`` and queues a job for
  each dead state whose cooldown is due, and for each group-check pair on its group's
  own ``check_interval`` that is due again.
* :meth:`HealthRunner.emergency` queues TCP jobs at once (the URLTest
  degradation detector calls it); :meth:`HealthRunner.network_changed` clears
  cooldowns, primes dead states and queues their probes at once.
* URLTest idle sleep: a node wanted only by URLTest groups that nobody selected
  for their ``idle_timeout`` is skipped by the periodic loop;
  :meth:`HealthRunner.note_selection` wakes such a group and probes its members
  at once.
* Every job carries a ticket from the health state. :meth:`reload` starts a new
  generation (in-flight results become stale) and cancels queued and running
  jobs; :meth:`stop` cancels everything and waits for the workers to finish.

All waiting reads the injected clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import uuid
from collections import deque
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from honk.alive.checkurl import DEFAULT_DELAY_URL
from honk.alive.group_checks import GroupChecks
from honk.alive.health import UDP_DOMAINS, AliveDialerSet, ProbeTicket
from honk.alive.outcome import Domain, Family, ProbeError, ProbeSample
from honk.alive.thresholds import PROBE_CONCURRENCY, RECOVERY_TICK_MAX
from honk.config.spec import DEFAULT_URLTEST_IDLE_TIMEOUT
from honk.core.clock import Clock
from honk.core.stats import RuntimeStats

log = logging.getLogger(__name__)

DELAY_TEST_METHOD = "HEAD"  # "delay tests use HEAD for both rounds"


@dataclass(frozen=True, slots=True)
class UdpOutcome:
    """One UDP probe round of a node: the DNS probe, and the QUIC handshake when it ran."""

    dns: ProbeSample | ProbeError
    quic: ProbeSample | ProbeError | None = None  # None: not a Score leaf, or no HTTPS check URL


class Prober(Protocol):
    """The measurements, through each node's own dial path (see :mod:`honk.alive.prober`)."""

    def families(self, node_id: uuid.UUID) -> tuple[Family, ...]:
        """The health families the node's server is reached over."""

    def udp_capable(self, node_id: uuid.UUID) -> bool: ...

    async def probe_tcp(self, node_id: uuid.UUID, family: Family) -> ProbeSample: ...

    async def probe_udp(self, node_id: uuid.UUID, family: Family) -> UdpOutcome: ...

    async def probe_url(self, node_id: uuid.UUID, url: str, method: str | None = None) -> ProbeSample: ...


class JobKind(enum.Enum):
    TCP = "tcp"
    UDP = "udp"
    GROUP_URL = "group-url"


# the probe-kind label of each job in the runtime stats (honk.core.stats.PROBE_KINDS)
_PROBE_KIND = {JobKind.TCP: "tcp", JobKind.UDP: "udp", JobKind.GROUP_URL: "url"}


@dataclass(frozen=True, slots=True)
class Job:
    kind: JobKind
    node_id: uuid.UUID  # for GROUP_URL: the member's current leaf
    family: Family = Family.V4
    member: str = ""  # GROUP_URL: the member tag results are recorded under
    url: str = ""  # GROUP_URL: the check_url


@dataclass(slots=True)
class _Demand:
    """Which nodes the periodic loop probes: URLTest groups may sleep, everything else never does."""

    always: frozenset[uuid.UUID] | None = None  # None: no demand given, every registered node
    # group -> (idle timeout, nodes)
    urltest: Mapping[str, tuple[float, frozenset[uuid.UUID]]] = field(default_factory=dict)


class _Batch:
    """Completion of one group of jobs (a cycle); ``done`` resolves when all have ended."""

    __slots__ = ("pending", "done")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.pending = 0
        self.done: asyncio.Future[None] = loop.create_future()

    def finish_one(self) -> None:
        self.pending -= 1
        if self.pending == 0 and not self.done.done():
            self.done.set_result(None)


class HealthRunner:
    """Schedules and runs probes for an :class:`AliveDialerSet`."""

    def __init__(
        self,
        alive: AliveDialerSet,
        prober: Prober,
        clock: Clock,
        *,
        check_interval: float,
        group_checks: GroupChecks | None = None,
        concurrency: int = PROBE_CONCURRENCY,
    ) -> None:
        if check_interval <= 0:
            raise ValueError("check_interval must be positive")
        self.alive = alive
        self.prober = prober
        self.clock = clock
        self.check_interval = check_interval
        self.recovery_tick = min(RECOVERY_TICK_MAX, check_interval)
        self.group_checks = group_checks or GroupChecks(alive.clock)
        self.concurrency = max(1, concurrency)
        self._demand = _Demand()
        self._last_used: dict[str, float] = {}
        self._queue: deque[tuple[Job, _Batch | None]] = deque()
        self._queued: set[Job] = set()
        self._running: dict[Job, ProbeTicket] = {}
        self._workers: set[asyncio.Task[None]] = set()
        self._loops: list[asyncio.Task[None]] = []
        self._stopping = False
        # the daemon's event counters (probe durations for /metrics); None: nothing is recorded
        self.stats: RuntimeStats | None = None
        # counters for /stats and the benchmark
        self.probes_run = 0
        self.peak_in_flight = 0
        self.cycles = 0

    # --- demand: which nodes the periodic loop wants ----------------------------------

    def set_demand(
        self,
        always: Iterable[uuid.UUID],
        urltest: Mapping[str, tuple[float | None, Iterable[uuid.UUID]]],
    ) -> None:
        """``always``: nodes some non-URLTest group (or a route) needs; ``urltest``: group ->
        (idle_timeout or None for the default, its reachable leaves)."""
        now = self.clock.now()
        groups = {}
        for name, (idle, nodes) in urltest.items():
            groups[name] = (DEFAULT_URLTEST_IDLE_TIMEOUT if idle is None else idle, frozenset(nodes))
            self._last_used.setdefault(name, now)  # a new group starts awake
        for name in list(self._last_used):
            if name not in groups:
                del self._last_used[name]
        self._demand = _Demand(frozenset(always), groups)

    def note_selection(self, group: str) -> None:
        """A real selection used URLTest ``group``; an asleep group wakes and probes at once."""
        if group not in self._last_used:
            return
        was_asleep = self._asleep(group, self.clock.now())
        self._last_used[group] = self.clock.now()
        if was_asleep:
            log.info("group %s: selected again; probing resumes", group)
            _, nodes = self._demand.urltest[group]
            self._submit(self._node_jobs(nodes, skip_dead=True), None)

    def _asleep(self, group: str, now: float) -> bool:
        idle, _ = self._demand.urltest[group]
        return now - self._last_used[group] >= idle

    def wanted_nodes(self) -> list[uuid.UUID]:
        """Registered nodes the periodic loop probes now, in registration order."""
        demand = self._demand
        if demand.always is None:
            return [node.node_id for node in self.alive.nodes()]
        now = self.clock.now()
        wanted = set(demand.always)
        for group, (_, nodes) in demand.urltest.items():
            if not self._asleep(group, now):
                wanted |= nodes
        return [node.node_id for node in self.alive.nodes() if node.node_id in wanted]

    # --- job construction ----------------------------------------------------------------

    def _node_jobs(self, node_ids: Iterable[uuid.UUID], *, skip_dead: bool) -> list[Job]:
        jobs = []
        alive = self.alive
        prober = self.prober
        for node_id in node_ids:
            udp = prober.udp_capable(node_id)
            for family in prober.families(node_id):
                if not (skip_dead and not alive.is_alive(node_id, Domain.TCP, family)):
                    jobs.append(Job(JobKind.TCP, node_id, family))
                if udp and not (
                    skip_dead
                    and not alive.is_alive(node_id, Domain.DNS_UDP, family)
                    and not alive.is_alive(node_id, Domain.DATA_UDP, family)
                ):
                    jobs.append(Job(JobKind.UDP, node_id, family))
        return jobs

    def cycle_jobs(self) -> list[Job]:
        """The jobs of one periodic cycle."""
        jobs = self._node_jobs(self.wanted_nodes(), skip_dead=True)
        for member, url, leaf in self.group_checks.members_to_probe(due_only=False):
            jobs.append(Job(JobKind.GROUP_URL, leaf, member=member, url=url))
        return jobs

    def recovery_jobs(self) -> list[Job]:
        """Jobs for the dead states whose cooldown is due."""
        jobs = []
        for node_id, domain, family in self.alive.due_for_recovery():
            kind = JobKind.TCP if domain is Domain.TCP else JobKind.UDP
            jobs.append(Job(kind, node_id, family))
        for member, url, leaf in self.group_checks.members_to_probe(due_only=True):
            jobs.append(Job(JobKind.GROUP_URL, leaf, member=member, url=url))
        # pairs of groups with their own check_interval, due again (checked every recovery tick)
        for member, url, leaf in self.group_checks.own_interval_due():
            jobs.append(Job(JobKind.GROUP_URL, leaf, member=member, url=url))
        return jobs

    # --- running -----------------------------------------------------------------------------

    def run_cycle(self) -> asyncio.Future[None]:
        """Queue one periodic cycle now; the future resolves when its jobs have ended."""
        self.cycles += 1
        return self._submit(self.cycle_jobs(), _Batch(asyncio.get_running_loop()))

    def run_recovery(self) -> asyncio.Future[None]:
        """Queue the due recovery probes now, and end the strike probations that ran out (what
        one recovery tick does)."""
        self.alive.lapse_probations()
        return self._submit(self.recovery_jobs(), _Batch(asyncio.get_running_loop()))

    def emergency(self, node_ids: Iterable[uuid.UUID]) -> None:
        """Probe these nodes' TCP at once (the real-traffic degradation detector fired)."""
        jobs = [
            Job(JobKind.TCP, nid, fam)
            for nid in node_ids
            if nid in self.alive
            for fam in self.prober.families(nid)
        ]
        self._submit(jobs, None)

    def network_changed(self, reason: str = "") -> None:
        """Links, addresses or routes changed: dead states are primed and probed now."""
        primed = self.alive.notify_network_change()
        self.group_checks.notify_network_change()
        log.info("network changed (%s): probing %d dead states now", reason or "netlink", len(primed))
        jobs = {
            Job(JobKind.TCP if domain is Domain.TCP else JobKind.UDP, node_id, family)
            for node_id, domain, family in primed
        }
        jobs.update(
            Job(JobKind.GROUP_URL, leaf, member=member, url=url)
            for member, url, leaf in self.group_checks.members_to_probe(due_only=True)
        )
        self._submit(sorted(jobs, key=_job_order), None)

    def _submit(self, jobs: Iterable[Job], batch: _Batch | None) -> asyncio.Future[None]:
        if batch is None:
            batch = _Batch(asyncio.get_running_loop())
        if self._stopping:
            batch.done.set_result(None)
            return batch.done
        queued = self._queued
        for job in jobs:
            if job in queued or job in self._running:
                continue
            queued.add(job)
            self._queue.append((job, batch))
            batch.pending += 1
        if batch.pending == 0:
            batch.done.set_result(None)
        self._staff()
        return batch.done

    def _staff(self) -> None:
        missing = min(self.concurrency, len(self._queue)) - len(self._workers)
        for _ in range(missing):
            task = asyncio.get_running_loop().create_task(self._work(), name="honk-probe")
            self._workers.add(task)
            task.add_done_callback(self._workers.discard)

    async def _work(self) -> None:
        queue = self._queue
        try:
            while queue:
                job, batch = queue.popleft()
                self._queued.discard(job)
                try:
                    await self._run(job)
                finally:
                    if batch is not None:
                        batch.finish_one()
        finally:
            # leave the staff in the same step that saw the queue empty: a done callback
            # would run later, and jobs queued meanwhile would find no worker to start
            self._workers.discard(asyncio.current_task())

    async def _run(self, job: Job) -> None:
        alive = self.alive
        ticket = alive.issue_ticket()
        self._running[job] = ticket
        if len(self._running) > self.peak_in_flight:
            self.peak_in_flight = len(self._running)
        self.probes_run += 1
        started = self.clock.now()
        try:
            if job.kind is JobKind.TCP:
                try:
                    sample = await self.prober.probe_tcp(job.node_id, job.family)
                except ProbeError:
                    self._timed(job, False, started)
                    alive.notify_check_failure(job.node_id, Domain.TCP, job.family, ticket)
                else:
                    self._timed(job, True, started)
                    alive.notify_check_success(
                        job.node_id, Domain.TCP, job.family, sample.rtt, ticket, rank=not sample.fallback
                    )
            elif job.kind is JobKind.UDP:
                outcome = await self.prober.probe_udp(job.node_id, job.family)
                self._timed(job, isinstance(outcome.dns, ProbeSample), started)
                self._apply_udp(job, outcome, ticket)
            else:
                try:
                    sample = await self.prober.probe_url(job.node_id, job.url)
                except ProbeError:
                    self._timed(job, False, started)
                    if alive.is_current(ticket):
                        self.group_checks.notify(job.member, job.url, None)
                else:
                    self._timed(job, True, started)
                    if alive.is_current(ticket):
                        self.group_checks.notify(job.member, job.url, sample.rtt)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("probe %s of %s crashed; counted as nothing", job.kind.value, job.node_id)
        finally:
            alive.retire_ticket(ticket)
            self._running.pop(job, None)

    def _timed(self, job: Job, ok: bool, started: float) -> None:
        """A finished measurement's duration on the runner's clock (cancelled and crashed
        probes measured nothing and are not recorded). A UDP round is ok when its DNS probe is."""
        if self.stats is not None:
            self.stats.probe(_PROBE_KIND[job.kind], ok, self.clock.now() - started)

    async def delay_test(
        self, node_id: uuid.UUID, url: str | None = None, expected: Container[int] | None = None
    ) -> ProbeSample | ProbeError:
        """An on-demand delay test (the API's): HEAD for both rounds to ``url`` (default
        :data:`~honk.alive.checkurl.DEFAULT_DELAY_URL`) through the node; with ``expected``,
        a final status outside it fails the test. The result goes to the node's history
        only: no liveness change, no strike, no Score evidence."""
        url = url or DEFAULT_DELAY_URL
        try:
            sample = await self.prober.probe_url(node_id, url, DELAY_TEST_METHOD)
            if expected is not None and sample.status not in expected:
                raise ProbeError("request", "unexpected-status")
        except ProbeError as exc:
            self.record_delay_failure(node_id, url)
            return exc
        self.alive.record_delay_test(node_id, self._family(node_id), sample.rtt, url)
        return sample

    def record_delay_failure(self, node_id: uuid.UUID, url: str | None = None) -> None:
        """A delay test through the node failed (or its caller's deadline passed): history only."""
        self.alive.record_delay_test(node_id, self._family(node_id), None, url or DEFAULT_DELAY_URL)

    def _family(self, node_id: uuid.UUID) -> Family:
        families = self.prober.families(node_id)
        return families[0] if families else Family.V4

    def _apply_udp(self, job: Job, outcome: UdpOutcome, ticket: ProbeTicket) -> None:
        """DNS success marks both UDP domains alive; a DNS failure fails DnsUdp and fails
        DataUdp too unless the QUIC handshake of the same round succeeded. DataUdp is
        settled first, so a DnsUdp death sees this round's data-path evidence."""
        alive, node_id, family = self.alive, job.node_id, job.family
        if isinstance(outcome.dns, ProbeSample):
            for domain in UDP_DOMAINS:
                alive.notify_check_success(node_id, domain, family, outcome.dns.rtt, ticket)
            return
        if isinstance(outcome.quic, ProbeSample):
            alive.notify_check_success(node_id, Domain.DATA_UDP, family, outcome.quic.rtt, ticket)
        else:
            alive.notify_check_failure(node_id, Domain.DATA_UDP, family, ticket)
        alive.notify_check_failure(node_id, Domain.DNS_UDP, family, ticket)

    # --- loops ------------------------------------------------------------------------------------

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._stopping = False
        self._loops = [
            loop.create_task(self._periodic(), name="honk-health-periodic"),
            loop.create_task(self._recovery(), name="honk-health-recovery"),
        ]

    async def _periodic(self) -> None:
        while True:
            self.run_cycle()
            await self.clock.sleep(self.check_interval)

    async def _recovery(self) -> None:
        while True:
            await self.clock.sleep(self.recovery_tick)
            self.run_recovery()

    @property
    def in_flight(self) -> int:
        return len(self._running)

    @property
    def queued(self) -> int:
        return len(self._queue)

    async def cancel_probes(self) -> None:
        """Drop queued jobs and cancel running ones, waiting until they have ended."""
        while self._queue:
            _, batch = self._queue.popleft()
            if batch is not None:
                batch.finish_one()
        self._queued.clear()
        workers = list(self._workers)
        for task in workers:
            task.cancel()
        for task in workers:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def reload(self, prober: Prober, check_interval: float | None = None) -> None:
        """A new generation: results of probes started before it never publish."""
        self.alive.next_generation()
        await self.cancel_probes()
        self.prober = prober
        if check_interval is not None and check_interval != self.check_interval:
            self.check_interval = check_interval
            self.recovery_tick = min(RECOVERY_TICK_MAX, check_interval)
            if self._loops:
                await self._stop_loops()
                self.start()

    async def _stop_loops(self) -> None:
        loops, self._loops = self._loops, []
        for task in loops:
            task.cancel()
        for task in loops:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def stop(self) -> None:
        """Stop every loop and probe; idempotent."""
        self._stopping = True
        await self._stop_loops()
        await self.cancel_probes()


def _job_order(job: Job) -> tuple[str, str, int, str, str]:
    return (job.kind.value, str(job.node_id), job.family.value, job.member, job.url)
