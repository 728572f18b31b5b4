"""The relay contract: what a proxy protocol's codec gives the relays that carry its stream.

A dialled upstream that is not plain bytes (Shadowsocks AEAD, VMess, and Trojan, VLESS or
VMess over TLS, with or without WebSocket) comes with a :class:`Framing`. Every relay
(the compiled engine, its pure-Python twin, the copy relay, the bridge behind
``framed_socket``) moves client bytes up through ``encryptor.encrypt`` and upstream bytes
down through ``decryptor.feed``, sends ``end()`` before forwarding the client's EOF, and
turns its own verdicts on what the upstream sent (the engine's ``FRAMING_*`` errnos) into
the codec's typed errors with ``error_for``. The compiled engine reads more of a concrete
framing (cipher keys, an SSLObject) to move bytes without Python; those are each class's
own business and are checked by the engine when it takes the flow.

The implementations are :class:`~honk.proto.shadowsocks.ShadowsocksFraming`,
:class:`~honk.proto.vmess.VmessFraming` and :class:`~honk.proto.tls_framing.TlsFraming`;
``tests/unit/proto/test_framing_contract.py`` holds each of them to this protocol.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from honk.core.errors import HonkError

__all__ = ["FRAMING_KINDS", "Framing", "FramingKind", "Opener", "Sealer"]

FramingKind = Literal["shadowsocks", "vmess", "tls"]
FRAMING_KINDS: tuple[FramingKind, ...] = ("shadowsocks", "vmess", "tls")


@runtime_checkable
class Sealer(Protocol):
    """The client → upstream direction: plaintext in, what goes on the wire out."""

    def encrypt(self, data: bytes) -> bytes: ...


@runtime_checkable
class Opener(Protocol):
    """The upstream → client direction: wire bytes in, plaintext out (possibly empty while a
    record or chunk is incomplete); a codec error (one of the framing's ``errors``) when the
    bytes do not verify."""

    @property
    def pending(self) -> bool:
        """Part of a salt, header, record or chunk is held: an EOF now truncates it."""
        ...

    def feed(self, data: bytes) -> bytes: ...


@runtime_checkable
class Framing(Protocol):
    """One upstream stream's codec state, as a relay drives it."""

    @property
    def kind(self) -> FramingKind:
        """Which protocol family frames the stream (the engine picks its path by it)."""
        ...

    @property
    def encryptor(self) -> Sealer: ...

    @property
    def decryptor(self) -> Opener: ...

    @property
    def errors(self) -> tuple[type[HonkError], ...]:
        """The codec errors ``decryptor.feed`` raises."""
        ...

    @property
    def answered(self) -> bool:
        """The server has sent something of its answer (an EOF before it is a refusal)."""
        ...

    def end(self) -> bytes:
        """What goes upstream before the client's EOF is forwarded (VMess: an empty chunk)."""
        ...

    def error_for(self, err: int) -> HonkError:
        """The codec's typed error for a relay's ``FRAMING_*`` verdict on the upstream's bytes."""
        ...


if TYPE_CHECKING:  # the type checker holds each implementation to the protocol
    from honk.proto.shadowsocks import ShadowsocksFraming
    from honk.proto.tls_framing import TlsFraming
    from honk.proto.vmess import VmessFraming

    def _conforms(a: ShadowsocksFraming, b: VmessFraming, c: TlsFraming) -> list[Framing]:
        x: Framing = a
        y: Framing = b
        z: Framing = c
        return [x, y, z]
