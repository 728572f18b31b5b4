"""A Trojan, VLESS or VMess stream over TLS, relayed by the relay engine itself (``DialedStream.framing``).

The outbound (:mod:`honk.outbound.stacked`) runs the TLS handshake in Python over
memory BIOs (:func:`honk.outbound.tls.tls_handshake`) and sends the protocol's
request header through it; from then on the relay owns the ``SSLObject`` and
moves the records itself:

* the compiled engine (:mod:`honk._fast.relay_c`) drives the ``SSL*`` behind the
  object from its worker thread, without the GIL (:attr:`TlsFraming.sslobj`,
  :attr:`TlsFraming.strip_header`);
* the twin and the asyncio copy relay go through :attr:`TlsFraming.encryptor`
  and :attr:`TlsFraming.decryptor`, as for the other framings.

What the server's side must look like depends on the inner protocol (the
``response`` object of :mod:`honk.proto.trojan` or :mod:`honk.proto.vless`):
Trojan passes the target's bytes as they are, but an EOF before any byte is
``closed-before-data``; VLESS strips ``version addons-length addons`` first
(``no-response``, ``truncated-header``, ``bad-version``). VMess frames both ways inside
the records (a :class:`~honk.proto.vmess.VmessFraming` as ``response``): client bytes
are sealed as chunks before they become records, the server's plaintext is its sealed
response header and chunks, and the client's EOF sends the ending chunk. A record that does not
decrypt or parse, or an alert from the server, is a :class:`TlsStreamError`.
A close_notify or a TCP EOF between records is the server's clean half-close.

Over a WebSocket transport (``websocket=True``: the upgrade was made through the
connection before the handover) the plaintext both ways is binary WebSocket
messages: client bytes go out as masked frames, the server's frames are opened
(the last ping of each read answered with a pong, a close frame ends the server's side like a
close_notify, a broken frame is a :class:`~honk.proto.websocket.WebSocketError`).
WebSocket has no half-close: the client's EOF sends nothing (:attr:`TlsFraming.half_close`
is false), the server's direction carries on until it closes.

Ownership: once a relay took the framing (:meth:`TlsFraming.claim`) nothing
else may touch the ``SSLObject`` (the compiled engine's worker may be inside
OpenSSL with it) until the relay gives it back with :meth:`TlsFraming.released`,
after the flow's END was delivered.
"""

from __future__ import annotations

import errno
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from honk.core.errors import CodecError, HonkError
from honk.proto.trojan import TrojanError, TrojanStreamWatch
from honk.proto.vless import VlessError, VlessResponseDecoder
from honk.proto.vmess import VmessAuthError, VmessError, VmessFraming
from honk.proto.websocket import ENGINE_ERRORS, WebSocketError, WsDecoder, WsEncoder

__all__ = ["HandshakeReport", "TlsFraming", "TlsStreamError"]

READ_CHUNK = 256 * 1024  # plaintext asked per SSLObject.read on the Python relays (bytes)


class TlsStreamError(CodecError):
    """The server's TLS records broke after the handshake: ``alert`` (the server sent a fatal
    alert) or ``bad-record`` (a record that does not decrypt or parse)."""

    protocol = "tls"


def tls_stream_error(detail: str) -> TlsStreamError:
    """The typed error for an OpenSSL failure while reading records (its reason text)."""
    return TlsStreamError("alert" if "ALERT" in detail.upper() else "bad-record", detail)


class _Sealer:
    """Client bytes -> TLS records (what the copy relays call ``encryptor``)."""

    __slots__ = ("_framing",)

    def __init__(self, framing: TlsFraming) -> None:
        self._framing = framing

    def encrypt(self, data: bytes) -> bytes:
        framing = self._framing
        if data:
            if framing.inner is not None:
                data = framing.inner.encryptor.encrypt(data)
            ws = framing.ws_encoder
            framing.sslobj.write(data if ws is None else ws.binary(data))  # a memory BIO takes all of it
        return framing.outgoing.read()  # also what reading made SSL want to send (a KeyUpdate)


class _Opener:
    """TLS records -> the inner protocol's plaintext (what the copy relays call ``decryptor``)."""

    __slots__ = ("_framing", "closed")

    def __init__(self, framing: TlsFraming) -> None:
        self._framing = framing
        self.closed = False  # the server's close_notify arrived: its side is over

    @property
    def pending(self) -> bool:
        """Whether an EOF now cuts the inner protocol's response header."""
        return bool(self._framing.response.pending)

    def feed(self, data: bytes) -> bytes:
        framing = self._framing
        if self.closed:
            return b""  # nothing after close_notify counts
        if data:
            framing.incoming.write(data)
        plain = bytearray()
        while True:
            try:
                chunk = framing.sslobj.read(READ_CHUNK)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.closed = True
                break
            except ssl.SSLError as exc:
                raise framing.failed(tls_stream_error(exc.reason or str(exc))) from None
            if not chunk:  # close_notify, reported as EOF while our own is not sent yet
                self.closed = True
                break
            plain += chunk
        data = bytes(plain)
        if data and framing.ws_decoder is not None:
            data = self._unframe(data)
        if not data:
            return b""
        try:
            return framing.response.feed(data)
        except HonkError as exc:
            raise framing.failed(exc) from None

    def _unframe(self, plain: bytes) -> bytes:
        """The payload of the server's WebSocket frames; the pong for the last ping is sealed for
        the upstream (``take_outgoing``), a close frame closes the server's side."""
        framing = self._framing
        assert framing.ws_decoder is not None and framing.ws_encoder is not None
        try:
            events = framing.ws_decoder.feed(plain)
        except WebSocketError as exc:
            raise framing.failed(exc) from None
        if events.pongs:  # the last ping of the batch (RFC 6455 5.5.3): pongs grow with reads, not pings
            framing.sslobj.write(framing.ws_encoder.pong(events.pongs[-1]))
        if events.closed is not None:
            self.closed = True
        return events.data


@dataclass(frozen=True, slots=True)
class HandshakeReport:
    """How far a handshake the relay engine drove got (:meth:`TlsFraming.handshake_reported`)."""

    started: bool  # the ClientHello went out: a failure from here on is the handshake's
    finished: bool
    verify_code: int  # X509_V_OK (0), or why the server's certificate was not accepted
    verify_message: str = ""  # OpenSSL's words for verify_code
    error: ssl.SSLError | None = None  # the twin's own exception, when it raised one


class TlsFraming:
    """A TLS connection past its handshake (and the request header), for the relay to carry.

    ``response`` reads the server's side of the inner protocol: a
    :class:`~honk.proto.trojan.TrojanStreamWatch`, a
    :class:`~honk.proto.vless.VlessResponseDecoder`, or a
    :class:`~honk.proto.vmess.VmessFraming` (:attr:`inner`: it frames the client's side
    too). ``on_release`` runs once the
    relay gave the connection back (the TLS session may be read again then).
    """

    kind: ClassVar[Literal["tls"]] = "tls"

    def __init__(
        self,
        sslobj: ssl.SSLObject,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        response: TrojanStreamWatch | VlessResponseDecoder | VmessFraming,
        on_release: Callable[[], None] | None = None,
        *,
        websocket: bool = False,
    ) -> None:
        self.sslobj = sslobj
        self.incoming = incoming
        self.outgoing = outgoing
        self.response = response
        # VLESS: the engine strips the response header itself (its version must be this byte)
        self.strip_header = isinstance(response, VlessResponseDecoder)
        self.version = response.version if isinstance(response, VlessResponseDecoder) else 0
        # VMess: its chunks both ways inside the records (the compiled engine frames them from
        # inner.engine_keys(), the Python relays through its encryptor and decryptor)
        self.inner = response if isinstance(response, VmessFraming) else None
        protocol_errors: type[HonkError] = (
            VmessError if self.inner is not None else VlessError if self.strip_header else TrojanError
        )
        self.errors: tuple[type[HonkError], ...] = (TlsStreamError, protocol_errors, WebSocketError)
        self.auth_errors: tuple[type[HonkError], ...] = (VmessAuthError,) if self.inner is not None else ()
        # WebSocket inside TLS (see the module docstring); the twin and the copy relay frame
        # through these, the compiled engine's worker does the same itself
        self.websocket = websocket
        self.ws_encoder = WsEncoder() if websocket else None
        self.ws_decoder = WsDecoder() if websocket else None
        self.half_close = not websocket  # the client's EOF goes upstream (close_notify, FIN)
        self._sealer: _Sealer | None = None  # made on first use (see encryptor)
        self._opener: _Opener | None = None
        self._on_release = on_release
        self._claimed = False
        self._released = False
        self._failure: HonkError | None = None  # what the Python relays' reading raised
        self._tls_detail = ""  # the compiled engine's OpenSSL reason for a broken record or an alert
        self._bad_version: int | None = None  # the compiled engine's VLESS version byte that did not match
        self._ws_error = 0  # the compiled engine's code for a broken WebSocket frame (ENGINE_ERRORS)
        # a handshake the relay engine drove (Engine.hs_connect), once its flow ended: how far it got
        self.handshake: HandshakeReport | None = None

    @property
    def encryptor(self) -> _Sealer:
        """The client's side, sealed into records (the twin's and the copy relay's way). Made on
        first use: it points back at the framing, and a flow the compiled engine carries never
        asks, so its framing is freed by reference counting, not by a collector pass."""
        if self._sealer is None:
            self._sealer = _Sealer(self)
        return self._sealer

    @property
    def decryptor(self) -> _Opener:
        """The server's side, opened out of records (made on first use, as :attr:`encryptor`)."""
        if self._opener is None:
            self._opener = _Opener(self)
        return self._opener

    def __repr__(self) -> str:
        return (
            f"TlsFraming(strip_header={self.strip_header}, vmess={self.inner is not None}, "
            f"websocket={self.websocket}, claimed={self._claimed})"
        )

    @property
    def answered(self) -> bool:
        """Whether the server sent any plaintext (EOF before it: the inner protocol's refusal)."""
        return bool(self.response.answered)

    @property
    def claimed(self) -> bool:
        """Whether a relay owns the connection now."""
        return self._claimed and not self._released

    def claim(self) -> None:
        """A relay takes the connection over; ValueError if one already did (a connection has
        one owner, or two threads could drive one ``SSL*``)."""
        if self._claimed:
            raise ValueError("framing: this TLS connection is already relayed")
        self._claimed = True

    def unclaim(self) -> None:
        """The relay that claimed it refused the flow before touching it."""
        self._claimed = False

    @property
    def tls_detail(self) -> str:
        """The compiled engine's OpenSSL reason for what ended the connection ("" without one)."""
        return self._tls_detail

    def when_released(self, hook: Callable[[], None]) -> None:
        """Run ``hook`` once the relay gave the connection back (instead of ``on_release``)."""
        self._on_release = hook

    def handshake_reported(
        self,
        started: bool,
        finished: bool,
        verify_code: int,
        verify_message: str = "",
        error: ssl.SSLError | None = None,
    ) -> None:
        """The relay engine that drove the handshake tells how far it got (before
        :meth:`released`): begun, finished, OpenSSL's certificate verification result, and the
        twin's own exception."""
        self.handshake = HandshakeReport(started, finished, verify_code, verify_message, error)

    def released(self, tls_detail: str = "", bad_version: int | None = None, ws_error: int = 0) -> None:
        """The relay is done with the connection (its END was delivered); ``tls_detail``,
        ``bad_version`` and ``ws_error`` are the compiled engine's words on what ended it."""
        if self._released:
            return
        self._released = True
        if tls_detail:
            self._tls_detail = tls_detail
        if bad_version is not None:
            self._bad_version = bad_version
        self._ws_error = ws_error
        hook, self._on_release = self._on_release, None
        if hook is not None:
            hook()

    def failed(self, error: HonkError) -> HonkError:
        """Note ``error`` as the reason the server's side broke (the first one counts)."""
        if self._failure is None:
            self._failure = error
        return error

    def end(self) -> bytes:
        """What the client's EOF sends before the upstream's FIN: VMess's ending chunk, then our
        close_notify (over WebSocket, which has no half-close, no close_notify: see
        :attr:`half_close`)."""
        if self.inner is not None:
            ending = self.inner.end()
            self.sslobj.write(ending if self.ws_encoder is None else self.ws_encoder.binary(ending))
        if not self.half_close:
            return self.outgoing.read()
        try:
            self.sslobj.unwrap()
        except ssl.SSLWantReadError:
            pass  # the server's close_notify has not come: it may still answer
        except ssl.SSLError:
            pass  # nothing can be sent any more; the FIN still goes
        return self.outgoing.read()

    def take_outgoing(self) -> bytes:
        """What reading made SSL want to send (a KeyUpdate reply, say): it goes upstream next."""
        return self.outgoing.read()

    def error_for(self, err: int) -> HonkError:
        """The typed error for a relay engine's FRAMING_* errno."""
        if self._failure is not None:
            return self._failure
        if self._tls_detail:
            return tls_stream_error(self._tls_detail)
        if 0 < self._ws_error <= len(ENGINE_ERRORS):
            return WebSocketError(ENGINE_ERRORS[self._ws_error - 1], "a frame from the server")
        response: Any = self.response
        if self.inner is not None:
            return self.inner.error_for(err)
        if err == errno.EPROTO and not self.strip_header:
            return TlsStreamError("bad-record", "the relay reported a broken record")
        if isinstance(response, VlessResponseDecoder):
            return response.error_for(err, self._bad_version)
        error: HonkError = response.error_for(err)
        return error
