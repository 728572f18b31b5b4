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
:func:`client_context` builds each distinct context once (loading a trust store
costs milliseconds) and checks at every dial, by one ``stat``, whether the file
it was built from changed, so a replaced file counts from the next dial; a
missing, unreadable or non-PEM file is a :class:`~honk.core.errors.ConfigRefused`
naming the node and the path.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket
import ssl
from collections.abc import Sequence

from honk.config.links import CA_KEY, INSECURE_KEYS, insecure_claimed
from honk.core.clock import Clock, timeout_at
from honk.core.errors import ConfigRefused, DialError, DialTimeout, HonkError, UpstreamFailed
from honk.relay.stream import StreamConn

__all__ = ["TlsFailed", "ca_path", "client_context", "tls_connect", "tls_verification"]

MAX_CA_BYTES = 1 << 20  # a node's CA file is a few certificates; anything bigger is a wrong path
CONTEXT_CACHE = 64  # distinct (verification, ALPN, trust store) contexts kept; nodes share them


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
    try:
        return not insecure_claimed(value for key, value in params if key in INSECURE_KEYS)
    except ValueError as exc:
        if str(exc) == "invalid":
            raise ConfigRefused("certificate verification parameters must be booleans") from None
        raise ConfigRefused("certificate verification parameters disagree") from None


def ca_path(params: tuple[tuple[str, str], ...]) -> str:
    """The node's CA file (its ``ca`` parameter), "" when it names none; ConfigRefused when they disagree."""
    paths = {value.strip() for key, value in params if key == CA_KEY and value.strip()}
    if len(paths) > 1:
        raise ConfigRefused("the node's ca parameters name different files")
    return paths.pop() if paths else ""


class _BadCa(Exception):
    """A CA file unfit to verify with (the caller names the node)."""


def _file_version(path: str | None) -> tuple[str, int, int] | None:
    """(path, mtime, size): what tells a replaced file from the one a context was built with."""
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return None  # the store the context falls back to, or the read below, says what is wrong
    return (path, st.st_mtime_ns, st.st_size)


def client_context(verify: bool, alpn: Sequence[str], ca: str, node: str) -> ssl.SSLContext:
    """The context ``node`` dials with: shared by every dial with the same verification, ALPN
    and trust store, and rebuilt when that store's file changes (a node's ``ca`` file, or the
    system's default bundle), so building it stays off the per-dial path while a replaced
    file still counts from the next dial. An unusable ``ca`` file is ConfigRefused."""
    if ca:
        store: tuple[object, ...] = ("node", _file_version(ca) or (ca, 0, 0))
    else:
        paths = ssl.get_default_verify_paths()  # SSL_CERT_FILE / SSL_CERT_DIR or the system's
        store = ("system", _file_version(paths.cafile), paths.capath)
    try:
        return _shared_context(verify, tuple(alpn), ca, store)
    except _BadCa as exc:
        raise ConfigRefused(f"{node}: {exc}") from None


@functools.lru_cache(maxsize=CONTEXT_CACHE)
def _shared_context(verify: bool, alpn: tuple[str, ...], ca: str, store: tuple[object, ...]) -> ssl.SSLContext:
    if ca:
        try:
            context = ssl.create_default_context(cadata=_read_ca(ca))
        except (ValueError, ssl.SSLError):  # text without a certificate, or a broken one
            raise _BadCa(f"the CA file {ca!r} holds no PEM certificate") from None
    else:
        context = ssl.create_default_context()
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    if alpn:
        context.set_alpn_protocols(list(alpn))
    return context


def _read_ca(path: str) -> str:
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_CA_BYTES + 1)
    except OSError as exc:
        raise _BadCa(f"cannot read the CA file {path!r}: {exc.strerror or exc}") from None
    if len(data) > MAX_CA_BYTES:
        raise _BadCa(f"the CA file {path!r} is over {MAX_CA_BYTES} bytes")
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        text = ""
    if not text.strip():  # create_default_context would quietly take the system store for ""
        raise _BadCa(f"the CA file {path!r} holds no PEM certificate")
    return text


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
