"""TLS from a node to its server: stdlib ``ssl`` over asyncio, failures typed by cause.

Shared by every leaf that speaks TLS to its server (``https://`` proxies today;
Trojan, VLESS and TLS transports next). The handshake runs under the dial
deadline; its failures are :class:`TlsFailed` (a ``DialError`` of phase
``tls``) with a stable ``reason``:

* ``certificate-untrusted``: the chain does not lead to a trusted CA (a
  self-signed certificate, or a CA missing from the trust store);
* ``certificate-expired`` (or not yet valid);
* ``certificate-name``: the certificate is not for the server name (SNI);
* ``handshake``: anything else the TLS layer refused (protocol versions,
  alerts, a server that does not speak TLS);
* ``timeout`` is a :class:`~honk.core.errors.DialTimeout` of phase ``tls``.

Verification is on unless the node's link says otherwise
(:func:`tls_verification`); the trust store is the system's, which honours
``SSL_CERT_FILE``, unless the node names its own CA. ALPN protocols are offered
when the node names them.

A node's own CA is its ``ca`` parameter (:func:`ca_path`): the path of a PEM file
holding one or more CA certificates (a relative path is taken from the daemon's
working directory). It replaces the system store for that node
only: a server certificate must chain to one of them, so a private CA does not
widen what other nodes trust, and the node does not fall back to public CAs.
:func:`read_ca` reads the file each time a context is built (at the dial), so a
replaced file counts from the next dial; a missing, unreadable or non-PEM file is
a :class:`~honk.core.errors.ConfigRefused` naming the node and the path.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Sequence

from honk.config.links import CA_KEY, INSECURE_FALSE, INSECURE_KEYS, INSECURE_TRUE
from honk.core.clock import Clock, timeout_at
from honk.core.errors import ConfigRefused, DialError, DialTimeout, HonkError, UpstreamFailed
from honk.relay.stream import StreamConn

__all__ = ["TlsFailed", "ca_path", "read_ca", "tls_connect", "tls_context", "tls_verification"]

MAX_CA_BYTES = 1 << 20  # a node's CA file is a few certificates; anything bigger is a wrong path


# OpenSSL's X509 verification codes (X509_V_ERR_*) as honk's reasons.
_VERIFY_REASONS = {
    9: "certificate-expired",  # CERT_NOT_YET_VALID
    10: "certificate-expired",  # CERT_HAS_EXPIRED
    62: "certificate-name",  # HOSTNAME_MISMATCH
    64: "certificate-name",  # IP_ADDRESS_MISMATCH
}


class TlsFailed(DialError):
    """The TLS handshake with the node's server failed; ``reason`` says why."""

    def __init__(self, outbound: str, reason: str, message: str) -> None:
        super().__init__(outbound, "tls", f"{reason}: {message}")
        self.reason = reason


def tls_verification(params: tuple[tuple[str, str], ...]) -> bool:
    """Whether to verify the server certificate; ConfigRefused for unknown or conflicting values."""
    verdicts = set()
    for key, value in params:
        if key in INSECURE_KEYS:
            word = value.strip().lower()
            if word in INSECURE_TRUE:
                verdicts.add(False)
            elif word in INSECURE_FALSE:
                verdicts.add(True)
            else:
                raise ConfigRefused(f"{key} must be a boolean")
    if len(verdicts) > 1:
        raise ConfigRefused("certificate verification parameters disagree")
    return verdicts.pop() if verdicts else True


def ca_path(params: tuple[tuple[str, str], ...]) -> str:
    """The node's CA file (its ``ca`` parameter), "" when it names none; ConfigRefused when they disagree."""
    paths = {value.strip() for key, value in params if key == CA_KEY and value.strip()}
    if len(paths) > 1:
        raise ConfigRefused("the node's ca parameters name different files")
    return paths.pop() if paths else ""


def read_ca(path: str, node: str) -> str:
    """The PEM text of ``node``'s CA file, checked to hold a certificate; "" when ``path`` is ""."""
    if not path:
        return ""
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_CA_BYTES + 1)
    except OSError as exc:
        raise ConfigRefused(f"{node}: cannot read the CA file {path!r}: {exc.strerror or exc}") from None
    if len(data) > MAX_CA_BYTES:
        raise ConfigRefused(f"{node}: the CA file {path!r} is over {MAX_CA_BYTES} bytes")
    try:
        text = data.decode("ascii")
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=text)
    except (UnicodeDecodeError, ValueError, ssl.SSLError):  # ValueError: no data at all
        raise ConfigRefused(f"{node}: the CA file {path!r} holds no PEM certificate") from None
    return text


def tls_context(verify: bool, alpn: Sequence[str] = (), ca: str = "") -> ssl.SSLContext:
    """A client context; ``ca`` (PEM text from :func:`read_ca`) replaces the system trust store."""
    context = ssl.create_default_context(cadata=ca) if ca else ssl.create_default_context()
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if alpn:
        context.set_alpn_protocols(list(alpn))
    return context


def _classify(outbound: str, exc: ssl.SSLError) -> TlsFailed:
    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = _VERIFY_REASONS.get(exc.verify_code, "certificate-untrusted")
        return TlsFailed(outbound, reason, exc.verify_message or "certificate verification failed")
    return TlsFailed(outbound, "handshake", exc.reason or type(exc).__name__)


async def tls_connect(
    sock: socket.socket,
    context: ssl.SSLContext,
    server_name: str,
    clock: Clock,
    deadline: float,
    outbound: str,
) -> StreamConn:
    """TLS over the connected ``sock`` (which it owns from here on, closed on failure)."""
    loop = asyncio.get_running_loop()
    try:
        try:
            async with timeout_at(clock, deadline):
                _, conn = await loop.create_connection(
                    lambda: StreamConn(UpstreamFailed), sock=sock, ssl=context, server_hostname=server_name
                )
        except BaseException:
            sock.close()  # a failed handshake closes its transport; this covers the rest
            raise
    except TimeoutError:
        raise DialTimeout(outbound, "tls", "no TLS handshake before the deadline") from None
    except ssl.SSLError as exc:
        raise _classify(outbound, exc) from None
    except (OSError, HonkError) as exc:
        raise TlsFailed(outbound, "handshake", f"the connection failed during the handshake: {exc}") from None
    return conn
