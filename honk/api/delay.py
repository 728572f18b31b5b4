"""On-demand delay tests, shared by the Clash and native APIs.

A test is the health subsystem's HTTP measurement (HEAD for both rounds, the
second round's RTT) through one leaf. For a node it goes through
:meth:`~honk.alive.runner.HealthRunner.delay_test`, so the node's history shows
it (a failure as delay 0) while liveness, strikes and Score evidence stay
untouched (GH-L-11). ``direct`` is measured the same way and recorded
nowhere; ``block`` always fails.

Every test answers within its ``timeout``: the measurement runs under that
deadline, and a timed-out node test is recorded as a failure. A group test
measures one ``(member, current leaf)`` pair per member, unchosen members
included, at most :data:`GROUP_DELAY_CONCURRENCY` at a time, under one deadline.
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass

from honk.alive.checkurl import DEFAULT_DELAY_URL, parse_check_url
from honk.alive.outcome import ProbeError, ProbeSample
from honk.alive.probe_http import measure_http
from honk.api.context import Control, running_plane
from honk.api.errors import ApiError
from honk.core.clock import timeout_at
from honk.core.net import Network
from honk.group.filter import node_id_of
from honk.outbound.base import Outbound

GROUP_DELAY_CONCURRENCY = 10  # "Group delay concurrency remains capped at 10"
DEFAULT_DELAY_TIMEOUT = 5.0  # seconds, when the caller gives none (mihomo's dashboards send 5000 ms)
MAX_DELAY_TIMEOUT = 32.767  # seconds; the Clash API's timeout is an int16 of milliseconds
DELAY_METHOD = "HEAD"  # "delay tests use HEAD for both rounds"

_ssl_context: ssl.SSLContext | None = None


@dataclass(frozen=True, slots=True)
class DelayResult:
    """One measurement: ``delay`` in seconds, or the reason it failed (``timeout`` or a probe error)."""

    delay: float | None
    error: str = ""  # "" on success; "timeout" when the deadline passed; else "<stage>:<reason>"
    status: int | None = None  # the final HTTP status when the probe saw one

    @property
    def ok(self) -> bool:
        return self.delay is not None

    @property
    def timed_out(self) -> bool:
        return self.error == "timeout"


def parse_expected(text: str | None) -> frozenset[int] | None:
    """Clash's ``expected`` status filter (``204``, ``200/204``, ``200-299``); None accepts any
    status the probe accepts. ApiError(400) for anything else."""
    if not text or text == "*":
        return None
    codes: set[int] = set()
    for part in text.replace(",", "/").split("/"):
        low, dash, high = part.strip().partition("-")
        try:
            first, last = int(low), int(high if dash else low)
        except ValueError:
            raise ApiError(
                400, "invalid_request", "expected must be statuses like 204, 200/204 or 200-299"
            ) from None
        if not 100 <= first <= last <= 599:
            raise ApiError(400, "invalid_request", "expected statuses must lie in 100-599")
        codes.update(range(first, last + 1))
    return frozenset(codes)


def parse_timeout(text: str | None) -> float:
    """The ``timeout`` query value (milliseconds) in seconds; ApiError(400) when invalid."""
    if text is None or text == "":
        return DEFAULT_DELAY_TIMEOUT
    try:
        ms = int(text)
    except ValueError:
        raise ApiError(400, "invalid_request", "timeout must be whole milliseconds") from None
    return timeout_from_ms(ms, "timeout")


def timeout_from_ms(ms: object, field: str) -> float:
    """A delay-test timeout given as whole milliseconds (1-32767), in seconds; ApiError(400)
    naming ``field`` otherwise."""
    if not isinstance(ms, int) or isinstance(ms, bool) or not 0 < ms <= MAX_DELAY_TIMEOUT * 1000:
        raise ApiError(
            400, "invalid_request", f"{field} must be whole milliseconds, 1-{int(MAX_DELAY_TIMEOUT * 1000)}"
        )
    return ms / 1000.0


async def test_leaf(
    control: Control, leaf: Outbound, url: str | None, timeout: float, expected: frozenset[int] | None = None
) -> DelayResult:
    """Measure ``url`` (default: the delay URL) through ``leaf`` within ``timeout`` seconds; a
    node's result goes to its history (a timeout as a failure)."""
    url = url or DEFAULT_DELAY_URL
    clock = control.clock
    node_id = node_id_of(leaf)
    runner = control.health.runner
    recorded = node_id is not None and runner is not None and node_id in control.health.alive
    try:
        async with timeout_at(clock, clock.now() + timeout):
            if recorded:
                outcome = await runner.delay_test(node_id, url, expected)
            else:
                outcome = _judge(await _measure_unrecorded(control, leaf, url), expected)
    except TimeoutError:
        if recorded:
            runner.record_delay_failure(node_id, url)
        return DelayResult(None, "timeout")
    if isinstance(outcome, ProbeError):
        return DelayResult(None, f"{outcome.phase}:{outcome.reason}")
    return DelayResult(outcome.rtt, "", outcome.status)


def _judge(outcome: ProbeSample | ProbeError, expected: frozenset[int] | None) -> ProbeSample | ProbeError:
    """A status outside ``expected`` is a failure (mihomo counts it as dead, delay 0)."""
    if isinstance(outcome, ProbeSample) and expected is not None and outcome.status not in expected:
        return ProbeError("request", "unexpected-status")
    return outcome


async def _measure_unrecorded(control: Control, leaf: Outbound, url: str) -> ProbeSample | ProbeError:
    """``direct`` (and any leaf without health): the same measurement, recorded nowhere."""
    global _ssl_context
    if leaf.protocol == "block":
        return ProbeError("dial", "blocked")
    try:
        parsed = parse_check_url(url, default_scheme="https")
    except ValueError:
        return ProbeError("setup", "invalid-url")
    if _ssl_context is None:
        _ssl_context = ssl.create_default_context()
    plane = running_plane(control)
    try:
        return await measure_http(
            leaf.dial_tcp,
            parsed,
            DELAY_METHOD,
            control.clock,
            stage_timeout=plane.spec.global_.connect_timeout,
            ssl_context=_ssl_context,
        )
    except ProbeError as exc:
        return exc


def leaf_of(control: Control, name: str) -> Outbound:
    """The leaf a delay test of ``name`` measures: a node or builtin itself, or a group's
    current TCP leaf. ApiError(404) for an unknown name."""
    plane = running_plane(control)
    if name in plane.outbounds:
        return plane.outbounds[name]
    if name in plane.groups:
        try:
            return plane.groups.resolve(name, Network.TCP, peek=True).leaf
        except Exception:  # noqa: BLE001 - a group with no pick has nothing to test
            raise ApiError(503, "no_selection", f"group {name} has no current selection") from None
    raise ApiError(404, "resource_not_found", "Resource not found")


async def test_group(
    control: Control, group: str, url: str | None, timeout: float, expected: frozenset[int] | None = None
) -> dict[str, DelayResult]:
    """Every member of ``group`` through its current leaf, at most 10 at a time, under one
    deadline; results keyed by member tag. ApiError(404) for an unknown group."""
    plane = running_plane(control)
    if group not in plane.groups:
        raise ApiError(404, "resource_not_found", "Resource not found")
    return await test_members(
        control, plane.groups.delay_test_members(group, Network.TCP), url, timeout, expected
    )


async def test_members(
    control: Control,
    pairs: list[tuple[str, Outbound]],
    url: str | None,
    timeout: float,
    expected: frozenset[int] | None = None,
) -> dict[str, DelayResult]:
    """Each ``(name, leaf)`` pair measured, at most 10 at a time, under one deadline of
    ``timeout`` seconds; results keyed by name (GLOBAL and provider health checks use it)."""
    gate = asyncio.Semaphore(GROUP_DELAY_CONCURRENCY)
    deadline = control.clock.now() + timeout

    async def one(leaf: Outbound) -> DelayResult:
        async with gate:
            left = deadline - control.clock.now()
            if left <= 0:
                return DelayResult(None, "timeout")
            return await test_leaf(control, leaf, url, left, expected)

    results = await asyncio.gather(*(one(leaf) for _, leaf in pairs))
    return {member: result for (member, _), result in zip(pairs, results, strict=True)}
