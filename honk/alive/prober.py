"""The real measurements of one plane generation: every probe goes through the node's own dial path.

:class:`NodeProber` is what :class:`~honk.alive.runner.HealthRunner` calls. It
holds the generation's leaves by NodeId and the global check settings:

* TCP: the two-round HTTP probe to the first ``tcp_check_url`` through the leaf
  (:mod:`honk.alive.probe_http`); with no URL configured, a raw TCP connect to
  the node's server (for ``direct``: to the UDP check's DNS server on TCP).
* UDP: one DNS query to the ``udp_check_dns`` target through the leaf's packet
  path, and for Score leaves the QUIC handshake to the first ``tcp_check_url``
  when it is HTTPS; the runner combines the two.
* A group's ``check_url``: the same HTTP probe to that URL through the member's
  current leaf.

A probe through a node whose runtime is cold runs inside the runtime's
:meth:`~honk.outbound.runtime.NodeRuntime.cold_guard`, so whatever shared resource
it opened (a mux carrier) is closed again afterwards.

The health family of a node is the family of its server address when that is an
IP literal; a named server is probed over IPv4 only (the dialer resolves it and
honk does not yet pin a family per dial), and ``direct`` over IPv4.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping

from honk.alive.checkurl import CheckUrl, parse_check_url
from honk.alive.outcome import Family, ProbeError, ProbeSample
from honk.alive.probe_dns import dns_check_target, measure_dns
from honk.alive.probe_http import measure_http, measure_tcp_connect
from honk.alive.probe_quic import measure_quic_handshake, quic_probe_target
from honk.alive.runner import UdpOutcome
from honk.alive.traffic import probing
from honk.config.spec import GlobalSpec
from honk.core.clock import Clock
from honk.core.net import Address
from honk.outbound.base import Outbound
from honk.outbound.direct import DirectOutbound

log = logging.getLogger(__name__)

DNS_TCP_PORT = 53  # the raw TCP check of ``direct`` connects to the DNS server over TCP


class NodeProber:
    """Measurements through the leaves of one generation, keyed by NodeId."""

    def __init__(
        self,
        leaves: Mapping[uuid.UUID, Outbound],
        settings: GlobalSpec,
        clock: Clock,
        *,
        score_leaves: Collection[uuid.UUID] = (),
        ssl_context: ssl.SSLContext | None = None,
        connect: Callable[[Address, float], object] | None = None,
    ) -> None:
        self.leaves = dict(leaves)
        self.clock = clock
        self.stage_timeout = settings.connect_timeout
        self.method = settings.tcp_check_http_method or "HEAD"
        self.score_leaves = frozenset(score_leaves)
        self.ssl_context = ssl_context
        self.check_url = _first_url(settings.tcp_check_url)
        self.quic_target = quic_probe_target(settings.tcp_check_url)
        self.dns_server = dns_check_target(settings.udp_check_dns)
        # the physical first hop for raw TCP checks: a plain connect, never through a proxy
        self._connect = connect or DirectOutbound(clock, settings.connect_timeout, name="health").dial_tcp
        self._families = {node_id: _families_of(leaf) for node_id, leaf in self.leaves.items()}
        self._urls: dict[str, CheckUrl | None] = {}

    # --- what the runner asks ------------------------------------------------------------

    def families(self, node_id: uuid.UUID) -> tuple[Family, ...]:
        return self._families.get(node_id, ())

    def udp_capable(self, node_id: uuid.UUID) -> bool:
        leaf = self.leaves.get(node_id)
        return leaf is not None and leaf.supports_udp

    async def probe_tcp(self, node_id: uuid.UUID, family: Family) -> ProbeSample:
        leaf = self._leaf(node_id)
        with _guarded(leaf):
            if self.check_url is not None:
                return await measure_http(
                    leaf.dial_tcp,
                    self.check_url,
                    self.method,
                    self.clock,
                    stage_timeout=self.stage_timeout,
                    ssl_context=self.ssl_context,
                )
            return await measure_tcp_connect(
                self._connect, self._raw_target(leaf), self.clock, stage_timeout=self.stage_timeout
            )

    async def probe_udp(self, node_id: uuid.UUID, family: Family) -> UdpOutcome:
        leaf = self._leaf(node_id)
        with _guarded(leaf):
            dns: ProbeSample | ProbeError
            try:
                dns = await measure_dns(leaf, self.dns_server, self.clock, stage_timeout=self.stage_timeout)
            except ProbeError as exc:
                dns = exc
            quic: ProbeSample | ProbeError | None = None
            if self.quic_target is not None and node_id in self.score_leaves:
                host, port = self.quic_target
                try:
                    quic = await measure_quic_handshake(
                        leaf,
                        host,
                        port,
                        self.clock,
                        stage_timeout=self.stage_timeout,
                        ssl_context_or_cafile=self.ssl_context,
                    )
                except ProbeError as exc:
                    quic = exc
            return UdpOutcome(dns, quic)

    async def probe_url(self, node_id: uuid.UUID, url: str, method: str | None = None) -> ProbeSample:
        """The HTTP probe to ``url`` through ``node_id``: a group's ``check_url`` through a
        member's current leaf (the configured method), or a delay test (``method`` HEAD)."""
        parsed = self._parsed(url)
        if parsed is None:
            raise ProbeError("setup", "invalid-url")
        leaf = self._leaf(node_id)
        with _guarded(leaf):
            return await measure_http(
                leaf.dial_tcp,
                parsed,
                method or self.method,
                self.clock,
                stage_timeout=self.stage_timeout,
                ssl_context=self.ssl_context,
            )

    # --- internals ---------------------------------------------------------------------------

    def _leaf(self, node_id: uuid.UUID) -> Outbound:
        leaf = self.leaves.get(node_id)
        if leaf is None:
            raise ProbeError("setup", "unknown-node")
        return leaf

    def _raw_target(self, leaf: Outbound) -> Address:
        server = getattr(leaf, "server", None)
        if isinstance(server, Address):
            return server
        return Address(self.dns_server.host, DNS_TCP_PORT)

    def _parsed(self, url: str) -> CheckUrl | None:
        if url not in self._urls:
            try:
                self._urls[url] = parse_check_url(url, default_scheme="https")
            except ValueError as exc:
                log.warning("a group check_url is not usable: %s", exc)
                self._urls[url] = None
        return self._urls[url]


def _first_url(urls: tuple[str, ...]) -> CheckUrl | None:
    """The first ``tcp_check_url``; none (or an empty first value) means raw TCP checks."""
    if not urls or not urls[0].strip():
        return None
    try:
        return parse_check_url(urls[0].strip())
    except ValueError as exc:
        log.warning("tcp_check_url is not usable (%s); health checks connect over raw TCP instead", exc)
        return None


def _families_of(leaf: Outbound) -> tuple[Family, ...]:
    return (Family(getattr(leaf, "health_family", Family.V4)),)


@contextlib.contextmanager
def _guarded(leaf: Outbound) -> Iterator[None]:
    """A probe through ``leaf``: not traffic, and a cold runtime is left as cold as it was."""
    runtime = getattr(leaf, "runtime", None)
    with probing(), runtime.cold_guard() if runtime is not None else contextlib.nullcontext():
        yield
