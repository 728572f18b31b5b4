"""Shadowsocks AEAD (SIP004) framing, without I/O.

Theory of operation:
  * The master key comes from the password through OpenSSL's
    ``EVP_BytesToKey`` (MD5, no salt, one round). Every stream direction and
    every UDP packet starts with its own random salt; the subkey for it is
    HKDF-SHA1(master, salt, info ``ss-subkey``).
  * A TCP direction is ``salt`` followed by chunks, each
    ``seal(2-byte big-endian length) seal(payload)``; every seal and open uses
    the next nonce (a 12-byte little-endian counter from 0). A payload holds
    at most :data:`MAX_PAYLOAD` bytes. The client's first payload begins with
    the target as a SOCKS5 address (``ATYP ADDR PORT``).
  * A UDP packet is ``salt seal(address + payload)`` under nonce 0.
  * Failures are typed: a tag that does not verify (wrong password, a flipped
    byte) is :class:`ShadowsocksAuthError`; malformed framing (an oversized
    length, a short packet, a bad address) is :class:`ShadowsocksProtocolError`.
    A decryptor that failed refuses all further input.

There is no replay filter: the client side never needs one.
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
from typing import ClassVar, Literal

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from honk.core.errors import ClientProtocolError, CodecError, HonkError
from honk.core.net import Address
from honk.proto.socks5 import encode_address, parse_address
from honk.proto.ss_methods import CIPHERS, LENGTH_SIZE, MAX_PAYLOAD, SUBKEY_INFO, Cipher

__all__ = [
    "CIPHERS",
    "MAX_PAYLOAD",
    "Cipher",
    "ShadowsocksAuthError",
    "ShadowsocksError",
    "ShadowsocksFraming",
    "ShadowsocksProtocolError",
    "StreamDecryptor",
    "StreamEncryptor",
    "decode_address",
    "derive_subkey",
    "encode_address",
    "master_key",
    "open_packet",
    "seal_packet",
]

SALT_POOL_BYTES = 4096  # random bytes fetched per getrandom call, handed out as salts (128 of 32 bytes)


class _SaltSource:
    """Salts from one buffer of the system's CSPRNG, refilled when spent: a connection burst costs
    a getrandom call per 128 salts instead of one per connection. Every byte is handed out once;
    a forked child starts with a new buffer (it must never repeat its parent's salts)."""

    def __init__(self) -> None:
        self._buf = b""
        self._pos = 0
        self._lock = threading.Lock()  # a salt may be taken from any thread
        os.register_at_fork(after_in_child=self._forget)

    def take(self, n: int) -> bytes:
        with self._lock:
            pos = self._pos
            if pos + n > len(self._buf):
                self._buf, pos = os.urandom(max(SALT_POOL_BYTES, n)), 0
            self._pos = pos + n
            return self._buf[pos : pos + n]

    def _forget(self) -> None:
        self._buf, self._pos = b"", 0
        self._lock = threading.Lock()


fresh_salt = _SaltSource().take


_AEADS: dict[str, type[AESGCM] | type[ChaCha20Poly1305]] = {
    "aes-128-gcm": AESGCM,
    "aes-256-gcm": AESGCM,
    "chacha20-ietf-poly1305": ChaCha20Poly1305,
}


# --- errors ----------------------------------------------------------------------


class ShadowsocksError(CodecError):
    """A Shadowsocks stream or packet could not be opened; ``reason`` is a stable slug."""

    protocol = "shadowsocks"


class ShadowsocksAuthError(ShadowsocksError):
    """A tag did not verify: the peer uses another password or cipher, or bytes were altered."""


class ShadowsocksProtocolError(ShadowsocksError):
    """The bytes authenticate (or cannot be checked) but break the framing rules."""


# --- keys ------------------------------------------------------------------------


def _cipher(name: str) -> Cipher:
    try:
        return CIPHERS[name]
    except KeyError:
        raise ValueError("unknown Shadowsocks AEAD cipher") from None


def master_key(password: str, key_size: int) -> bytes:
    """``EVP_BytesToKey(MD5, no salt, 1 round)`` of the UTF-8 password, cut to ``key_size``."""
    secret = password.encode("utf-8")
    out = b""
    block = b""
    while len(out) < key_size:
        block = hashlib.md5(block + secret, usedforsecurity=False).digest()
        out += block
    return out[:key_size]


def derive_subkey(cipher: str, master: bytes, salt: bytes) -> bytes:
    """The per-direction (or per-packet) key: HKDF-SHA1 over ``master`` with ``salt``."""
    spec = _cipher(cipher)
    if len(master) != spec.key_size:
        raise ValueError(f"{cipher} needs a {spec.key_size}-byte master key")
    if len(salt) != spec.salt_size:
        raise ValueError(f"{cipher} needs a {spec.salt_size}-byte salt")
    hkdf = HKDF(algorithm=hashes.SHA1(), length=spec.key_size, salt=salt, info=SUBKEY_INFO)
    return hkdf.derive(master)


def _nonce(counter: int, size: int) -> bytes:
    return counter.to_bytes(size, "little")


# --- addresses -------------------------------------------------------------------


def decode_address(data: bytes | bytearray | memoryview, offset: int = 0) -> tuple[Address, int]:
    """The SOCKS5-style address at ``offset`` and the offset just past it.

    Raises :class:`ShadowsocksProtocolError` (``bad-address`` or
    ``truncated-address``). :func:`encode_address` is the inverse.
    """
    try:
        parsed = parse_address(data, offset)
    except ClientProtocolError as exc:  # the SOCKS5 codec speaks for a client; here it is the server
        raise ShadowsocksProtocolError("bad-address", exc.reason) from None
    if parsed is None:
        raise ShadowsocksProtocolError("truncated-address")
    return parsed


# --- TCP -------------------------------------------------------------------------


class StreamEncryptor:
    """One direction of a Shadowsocks TCP stream, sending side.

    ``salt`` is random unless given (tests pin it); ``nonce`` is the counter the
    next seal uses; ``salt_sent`` turns true once :meth:`encrypt` has returned
    the salt. A relay that continues the stream elsewhere starts from
    ``subkey`` and ``nonce``.
    """

    def __init__(self, cipher: str, master: bytes, salt: bytes | None = None) -> None:
        spec = _cipher(cipher)
        if len(master) != spec.key_size:
            raise ValueError(f"{cipher} needs a {spec.key_size}-byte master key")
        if salt is not None and len(salt) != spec.salt_size:
            raise ValueError(f"{cipher} needs a {spec.salt_size}-byte salt")
        self.cipher = spec
        self.salt = salt if salt is not None else fresh_salt(spec.salt_size)
        self.nonce = 0
        self.salt_sent = False
        self._master = master
        # derived at the first use: a stream the relay engine opens itself never needs them here
        self._subkey: bytes | None = None
        self._aead: AESGCM | ChaCha20Poly1305 | None = None

    @property
    def subkey(self) -> bytes:
        if self._subkey is None:
            self._subkey = derive_subkey(self.cipher.name, self._master, self.salt)
        return self._subkey

    def _seal(self, data: bytes | memoryview) -> bytes:
        aead = self._aead
        if aead is None:
            aead = self._aead = _AEADS[self.cipher.name](self.subkey)
        sealed = aead.encrypt(_nonce(self.nonce, self.cipher.nonce_size), data, None)
        self.nonce += 1
        return sealed

    def encrypt(self, plain: bytes | bytearray | memoryview) -> bytes:
        """Wire bytes for ``plain``: the salt first on the first call, then
        chunks of at most :data:`MAX_PAYLOAD` bytes. Empty input yields no chunk."""
        parts: list[bytes] = []
        if not self.salt_sent:
            parts.append(self.salt)
            self.salt_sent = True
        view = memoryview(plain)
        for start in range(0, len(view), MAX_PAYLOAD):
            chunk = view[start : start + MAX_PAYLOAD]
            parts.append(self._seal(len(chunk).to_bytes(LENGTH_SIZE, "big")))
            parts.append(self._seal(chunk))
        return b"".join(parts)


class StreamDecryptor:
    """One direction of a Shadowsocks TCP stream, receiving side.

    Feed it wire bytes in any split; it returns the plaintext of every chunk
    completed so far. ``salt``, ``subkey`` are ``None`` until the salt has
    arrived; ``nonce`` is the counter the next open uses.
    """

    def __init__(self, cipher: str, master: bytes) -> None:
        spec = _cipher(cipher)
        if len(master) != spec.key_size:
            raise ValueError(f"{cipher} needs a {spec.key_size}-byte master key")
        self.cipher = spec
        self._master = master
        self.salt: bytes | None = None
        self.subkey: bytes | None = None
        self.nonce = 0
        self._aead: AESGCM | ChaCha20Poly1305 | None = None
        self._buf = bytearray()
        self._payload_len = -1  # a length already opened whose payload has not fully arrived
        self._failed: ShadowsocksError | None = None

    @property
    def failed(self) -> bool:
        return self._failed is not None

    @property
    def pending(self) -> bool:
        """Whether part of the salt or of a chunk is buffered: an EOF now truncates the stream."""
        return bool(self._buf) or self._payload_len >= 0

    def feed(self, data: bytes | bytearray | memoryview) -> bytes:
        """Plaintext completed by ``data`` (may be ``b""``).

        Raises :class:`ShadowsocksAuthError` or :class:`ShadowsocksProtocolError`;
        after either, every call raises the same kind of error again.
        """
        failed = self._failed
        if failed is not None:
            raise type(failed)(failed.reason, "the stream already failed")
        self._buf += data
        try:
            return self._drain()
        except ShadowsocksError as exc:
            self._failed = exc
            # a new buffer, not clear(): the traceback may still hold views of the old one
            self._buf = bytearray()
            raise

    def _drain(self) -> bytes:
        buf = self._buf
        spec = self.cipher
        pos = 0
        if self._aead is None:
            if len(buf) < spec.salt_size:
                return b""
            self.salt = bytes(buf[: spec.salt_size])
            self.subkey = derive_subkey(spec.name, self._master, self.salt)
            self._aead = _AEADS[spec.name](self.subkey)
            pos = spec.salt_size
        aead = self._aead
        assert aead is not None  # made from the salt above
        tag = spec.tag_size
        end = len(buf)
        out: list[bytes] = []
        view = memoryview(buf)
        try:
            while True:
                if self._payload_len < 0:
                    if end - pos < LENGTH_SIZE + tag:
                        break
                    length = int.from_bytes(self._open(aead, view[pos : pos + LENGTH_SIZE + tag]), "big")
                    pos += LENGTH_SIZE + tag
                    if length > MAX_PAYLOAD:
                        raise ShadowsocksProtocolError("chunk-too-long", f"length={length:#06x}")
                    self._payload_len = length
                need = self._payload_len + tag
                if end - pos < need:
                    break
                out.append(self._open(aead, view[pos : pos + need]))
                pos += need
                self._payload_len = -1
        finally:
            view.release()  # a bytearray cannot shrink while a view is exported
        del buf[:pos]
        return b"".join(out)

    def _open(self, aead: AESGCM | ChaCha20Poly1305, sealed: memoryview) -> bytes:
        try:
            plain = aead.decrypt(_nonce(self.nonce, self.cipher.nonce_size), sealed, None)
        except InvalidTag:
            raise ShadowsocksAuthError("bad-tag") from None
        self.nonce += 1
        return plain


class ShadowsocksFraming:
    """What the relay applies to a dialed Shadowsocks stream (``DialedStream.framing``).

    ``encryptor`` has already sent its salt and the target header; the relay
    seals client bytes from ``encryptor.nonce`` on. ``decryptor`` has read
    nothing yet: the server's salt is the first thing the relay feeds it.

    A stream the relay engine dials itself hands over a *fresh* framing, made
    without either: the compiled engine picks the salt, sends it and seals the
    header (``Engine.hs_connect``), so a connection costs no Python codec
    objects; whoever reads ``encryptor`` or ``decryptor`` first (the pure-Python
    twin, the copy relay) gets new ones, with a fresh random salt.
    """

    __slots__ = ("cipher", "master", "_encryptor", "_decryptor")

    def __init__(
        self,
        cipher: str,
        master: bytes,
        encryptor: StreamEncryptor | None = None,
        decryptor: StreamDecryptor | None = None,
    ) -> None:
        self.cipher = cipher
        self.master = master
        self._encryptor = encryptor
        self._decryptor = decryptor

    @property
    def fresh(self) -> bool:
        """Nothing sent and no salt chosen yet: the engine may pick the salt itself."""
        return self._encryptor is None

    def new_salt(self) -> bytes:
        """A salt for a fresh framing's first bytes (the engine seals them itself)."""
        return fresh_salt(CIPHERS[self.cipher].salt_size)

    @property
    def encryptor(self) -> StreamEncryptor:
        if self._encryptor is None:
            self._encryptor = StreamEncryptor(self.cipher, self.master)
        return self._encryptor

    @property
    def decryptor(self) -> StreamDecryptor:
        if self._decryptor is None:
            self._decryptor = StreamDecryptor(self.cipher, self.master)
        return self._decryptor

    def __repr__(self) -> str:
        return f"ShadowsocksFraming(cipher={self.cipher!r})"

    kind: ClassVar[Literal["shadowsocks"]] = "shadowsocks"
    errors: ClassVar[tuple[type[HonkError], ...]] = (ShadowsocksError,)
    auth_errors: ClassVar[tuple[type[HonkError], ...]] = (ShadowsocksAuthError,)
    answered: ClassVar[bool] = True  # EOF before the server's salt is a plain close, not a refusal

    def end(self) -> bytes:
        """What the client's EOF sends before the upstream's FIN: nothing (the FIN says it)."""
        return b""

    def error_for(self, err: int) -> HonkError:
        """The typed error for a relay engine's FRAMING_* errno."""
        if err == errno.EBADMSG:
            return ShadowsocksAuthError("bad-tag", "an upstream chunk did not verify")
        if err == errno.EPROTO:
            return ShadowsocksProtocolError("chunk-too-long")
        return ShadowsocksProtocolError("truncated", "the upstream closed inside a chunk")


# --- UDP -------------------------------------------------------------------------


def seal_packet(cipher: str, master: bytes, payload: bytes, salt: bytes | None = None) -> bytes:
    """One UDP packet: ``salt`` + ``payload`` sealed under nonce 0 (``payload``
    already starts with the address)."""
    spec = _cipher(cipher)
    if salt is None:
        salt = fresh_salt(spec.salt_size)
    aead = _AEADS[cipher](derive_subkey(cipher, master, salt))
    return salt + aead.encrypt(bytes(spec.nonce_size), payload, None)


def open_packet(cipher: str, master: bytes, packet: bytes) -> bytes:
    """The plaintext (address + payload) of one UDP packet.

    Raises :class:`ShadowsocksProtocolError` (``packet-too-short``) or
    :class:`ShadowsocksAuthError` (``bad-tag``).
    """
    spec = _cipher(cipher)
    if len(packet) < spec.salt_size + spec.tag_size:
        raise ShadowsocksProtocolError("packet-too-short", f"{len(packet)} bytes")
    view = memoryview(packet)
    aead = _AEADS[cipher](derive_subkey(cipher, master, bytes(view[: spec.salt_size])))
    try:
        plain: bytes = aead.decrypt(bytes(spec.nonce_size), view[spec.salt_size :], None)
        return plain
    except InvalidTag:
        raise ShadowsocksAuthError("bad-tag") from None
