"""The Score QUIC handshake probe: a real TLS-in-QUIC handshake with ALPN ``h3`` (GH-F-21).

Why a handshake and not a request: it is the least a QUIC server must answer
to, and it proves that full-size datagrams (the client's Initial is padded to
1200 bytes) cross the node's packet path both ways. The health layer uses it as
DataUdp evidence when the DNS probe fails (GH-F-20); it never says anything
about throughput.

aioquic's sans-I/O :class:`QuicConnection` is driven by hand over the leaf's
:class:`~honk.outbound.base.PacketEndpoint`: every datagram it wants sent goes
out through ``endpoint.send``, every reply from the pinned server goes into
``receive_datagram``, and its retransmission timers are armed on the injected
clock, whose ``now`` is also the connection's time. The host of the target is
resolved once and the IP pinned for the probe (GH-F-25); the certificate is
checked against the URL's host (or ``server_name``).

Every failure is ``ProbeError("quic", reason)`` with a static reason:
``resolve``, ``dial``, ``timeout``, ``tls`` (a TLS alert either way,
certificate errors included), ``alpn``, ``closed`` (any other close), ``lost``
(the endpoint ended), ``internal`` (the QUIC stack raised).
"""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from honk.alive.outcome import ProbeError, ProbeSample
from honk.alive.probe_dns import open_endpoint, pin_address
from honk.core.clock import Clock, TimerHandle, timeout_at
from honk.core.errors import HonkError
from honk.core.net import Address
from honk.outbound.base import PacketEndpoint

if TYPE_CHECKING:  # aioquic is imported when a QUIC probe first runs: it costs ~10 MB of memory
    from aioquic.quic.configuration import QuicConfiguration
    from aioquic.quic.connection import QuicConnection
    from aioquic.quic.events import ConnectionTerminated

__all__ = ["ALPN_H3", "measure_quic_handshake", "quic_probe_target"]

log = logging.getLogger(__name__)

ALPN_H3 = "h3"  # "a real TLS-in-QUIC handshake with ALPN `h3`"
HTTPS_PORT = 443  # the default port of an https URL
# RFC 9001 section 4.8: a TLS alert travels as CRYPTO_ERROR plus the alert's code (0x100..0x1ff).
NO_ERROR = 0x0  # RFC 9000 section 20.1 transport error codes (aioquic's QuicErrorCode)
CRYPTO_ERROR = 0x100  # RFC 9000 section 20.1 (aioquic's QuicErrorCode.CRYPTO_ERROR)
TLS_ALERT_CODES = range(CRYPTO_ERROR, CRYPTO_ERROR + 0x100)
IDLE_TIMEOUT_CODE = 0x1  # INTERNAL_ERROR: what aioquic reports when its idle timer ends a connection
IDLE_TIMEOUT_PHRASE = "Idle timeout"

# A trust anchor: a CA file path, PEM bytes, or an SSLContext whose CA certificates are used.
Trust = str | os.PathLike[str] | bytes | ssl.SSLContext | None


def quic_probe_target(tcp_check_urls: Sequence[str]) -> tuple[str, int] | None:
    """``(host, port)`` of the first configured ``tcp_check_url`` when it is a valid ``https`` URL.

    Only the first URL counts; a missing, non-HTTPS or unparseable one disables
    the probe (``None``): "A missing or non-HTTPS URL disables this probe".
    """
    if not tcp_check_urls:
        return None
    try:
        parts = urlsplit(tcp_check_urls[0].strip())
        port = parts.port
    except ValueError:  # a bad port or bracket
        return None
    if parts.scheme.lower() != "https" or not parts.hostname or port == 0:
        return None
    return parts.hostname, port if port is not None else HTTPS_PORT


async def measure_quic_handshake(
    leaf,  # noqa: ANN001 - an Outbound
    host: str,
    port: int,
    clock: Clock,
    *,
    stage_timeout: float,
    ssl_context_or_cafile: Trust = None,
    server_name: str | None = None,
) -> ProbeSample:
    """One QUIC handshake with ``host:port`` through ``leaf``; the RTT from the first Initial to completion.

    Resolving, opening the endpoint and the handshake each get ``stage_timeout``.
    Certificates are always verified: against ``ssl_context_or_cafile`` when
    given, else the system store. The connection is closed (a CONNECTION_CLOSE
    is sent when it got that far) and the endpoint released on every way out.
    """
    try:
        server = await pin_address(host, port, clock, stage_timeout)
    except (TimeoutError, OSError):
        raise ProbeError("quic", "resolve") from None
    from aioquic.quic.connection import QuicConnection

    name = server_name if server_name is not None else Address(host, port).host
    handshake = _Handshake(
        QuicConnection(configuration=_configuration(name, ssl_context_or_cafile)), server, clock
    )
    try:
        endpoint = await open_endpoint(leaf, handshake.receive, clock, stage_timeout, "quic", handshake.lost)
    except ProbeError:
        raise ProbeError("quic", "dial") from None
    try:
        started = clock.now()
        handshake.start(endpoint, started)
        try:
            async with timeout_at(clock, started + stage_timeout):
                outcome = await handshake.outcome
        except TimeoutError:
            raise ProbeError("quic", "timeout") from None
        if isinstance(outcome, str):
            raise ProbeError("quic", outcome)
        return ProbeSample(rtt=outcome)
    finally:
        handshake.finish()
        endpoint.close()


def _configuration(server_name: str, trust: Trust) -> QuicConfiguration:
    from aioquic.quic.configuration import QuicConfiguration

    config = QuicConfiguration(
        is_client=True, alpn_protocols=[ALPN_H3], verify_mode=ssl.CERT_REQUIRED, server_name=server_name
    )
    if isinstance(trust, ssl.SSLContext):
        ders = trust.get_ca_certs(binary_form=True)
        if ders:
            config.cadata = "".join(ssl.DER_cert_to_PEM_cert(der) for der in ders).encode()
            return config
        trust = None  # the context holds no listed CA (a lazily read directory): the system store
    if isinstance(trust, bytes):
        config.cadata = trust
    elif trust is not None:
        config.cafile = os.fspath(trust)
    else:
        paths = ssl.get_default_verify_paths()
        if paths.cafile or paths.capath:  # else aioquic's own default bundle
            config.cafile, config.capath = paths.cafile, paths.capath
    return config


def _termination_reason(event: ConnectionTerminated) -> str:
    if event.error_code in TLS_ALERT_CODES:
        return "tls"
    if event.error_code == IDLE_TIMEOUT_CODE and event.reason_phrase == IDLE_TIMEOUT_PHRASE:
        return "timeout"
    return "closed"


class _Handshake:
    """Drives one client :class:`QuicConnection` over a packet endpoint until the handshake settles.

    ``outcome`` resolves to the RTT (seconds on the clock) or a failure reason.
    """

    def __init__(self, connection: QuicConnection, server: Address, clock: Clock) -> None:
        self.connection = connection
        self.server = server
        self.clock = clock
        self.outcome: asyncio.Future[float | str] = asyncio.get_running_loop().create_future()
        self._addr = (server.host, server.port)  # the connection's network path
        self._endpoint: PacketEndpoint | None = None
        self._timer: TimerHandle | None = None
        self._started_at = 0.0

    def start(self, endpoint: PacketEndpoint, now: float) -> None:
        self._endpoint = endpoint
        self._started_at = now  # the first Initial leaves in this call's transmit
        self.connection.connect(self._addr, now)
        self._pump(now)

    def receive(self, payload: bytes, source: Address) -> None:
        if self.outcome.done() or self._endpoint is None or source != self.server:
            return
        self._step(lambda now: self.connection.receive_datagram(payload, self._addr, now))

    def lost(self, error: HonkError | None) -> None:
        if error is not None:
            self._settle("lost")

    def finish(self) -> None:
        """Stop the timer; close the connection and send its CONNECTION_CLOSE if it ever started."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._endpoint is not None:
            self.connection.close(error_code=NO_ERROR)
            self._transmit(self.clock.now())
        self._settle("closed")

    def _on_timer(self) -> None:
        self._timer = None
        if not self.outcome.done():
            self._step(self.connection.handle_timer)

    def _step(self, action) -> None:  # noqa: ANN001 - a callable taking the clock's now
        now = self.clock.now()
        try:
            action(now)
            self._pump(now)
        except Exception:  # a fault in the QUIC stack fails the probe instead of hanging it
            log.exception("QUIC handshake probe: the QUIC stack raised")
            self._settle("internal")

    def _pump(self, now: float) -> None:
        from aioquic.quic.events import ConnectionTerminated, HandshakeCompleted

        while (event := self.connection.next_event()) is not None:
            if isinstance(event, HandshakeCompleted):
                self._settle(now - self._started_at if event.alpn_protocol == ALPN_H3 else "alpn")
            elif isinstance(event, ConnectionTerminated):
                self._settle(_termination_reason(event))
        self._transmit(now)  # on completion this carries the client's Finished
        if self.outcome.done():
            return  # no more timers: finish() closes the connection
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        at = self.connection.get_timer()
        if at is not None:
            self._timer = self.clock.call_later(at - now, self._on_timer)

    def _transmit(self, now: float) -> None:
        endpoint = self._endpoint
        if endpoint is None:
            return
        for data, _ in self.connection.datagrams_to_send(now):
            endpoint.send(data, self.server)

    def _settle(self, result: float | str) -> None:
        if not self.outcome.done():
            self.outcome.set_result(result)
