"""VMess client framing with the AEAD header ("alterId 0"), without I/O.

Theory of operation (v2ray ``proxy/vmess``, ``proxy/vmess/aead``):
  * The user's UUID gives ``cmd_key = MD5(uuid bytes + VMESS_MAGIC)``. Every
    further key comes from :func:`kdf`, a chain of HMAC-SHA256 whose innermost
    key is ``"VMess AEAD KDF"`` and each salt of the path wraps one more HMAC
    around the previous one.
  * The request is ``auth_id(16) seal(len)(18) nonce(8) seal(header)``. The
    auth id is one AES-128 block over ``timestamp(8) random(4) crc32(4)``; the
    two seals are AES-128-GCM with keys and nonces derived from ``cmd_key``,
    the auth id and the 8-byte connection nonce, the auth id as associated data.
  * The plaintext header carries a fresh body key and IV (16 bytes each), a
    response check byte, the option bits, the body security, the command and
    the target (port first, then the address), random padding and an FNV-1a
    checksum.
  * The body is chunks: a 2-byte length XOR a SHAKE128 mask over the IV
    (option ``M``), then the payload sealed with a 2-byte counter nonce (or
    plain, for ``none``). An empty sealed chunk ends the direction. A UDP
    command sends each packet as one chunk.
  * The response uses key/IV ``SHA256(request key/IV)[:16]``. It starts with a
    sealed length and a sealed header whose first byte must echo the check byte;
    then chunks exactly like the request's, with the response key and IV.
  * Failures are typed: a tag that does not verify or a wrong check byte is
    :class:`VmessAuthError`; broken framing is :class:`VmessProtocolError`. A
    decoder that failed refuses all further input.

The legacy MD5-authenticated header (``alterId > 0``) is not implemented;
:func:`check_alter_id` says so.
"""

from __future__ import annotations

import enum
import errno
import functools
import hashlib
import os
import struct
import uuid as uuid_mod
import zlib
from collections.abc import Callable
from typing import Any, ClassVar, Literal

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

from honk._fast.vmesskdf import kdf
from honk.core.errors import CodecError, HonkError
from honk.core.net import Address

__all__ = [
    "COMMAND_TCP",
    "COMMAND_UDP",
    "MAX_PAYLOAD",
    "SECURITIES",
    "Security",
    "VmessAuthError",
    "VmessClient",
    "VmessError",
    "VmessFraming",
    "VmessProtocolError",
    "VmessResponseDecoder",
    "auth_id",
    "check_alter_id",
    "cmd_key",
    "kdf",
    "open_aead_header",
    "seal_aead_header",
]

# --- constants (v2ray proxy/vmess, common/protocol) --------------------------------

VMESS_MAGIC = b"c48619fe-8f02-49e0-b9e9-edf763e17e21"  # appended to the UUID for cmd_key
VERSION = 1  # the only request header version
COMMAND_TCP = 0x01
COMMAND_UDP = 0x02
# Option bits of the request header (common/protocol/headers.go).
OPTION_CHUNK_STREAM = 0x01  # S: the body is a chunk stream
OPTION_CHUNK_MASKING = 0x04  # M: chunk lengths XOR a SHAKE128 stream
OPTION_GLOBAL_PADDING = 0x08  # P: random padding after each chunk (not used here)
# Address types in VMess order (port first, then type and address).
ADDR_IPV4 = 0x01
ADDR_DOMAIN = 0x02
ADDR_IPV6 = 0x03

# KDF salts (proxy/vmess/aead/consts.go); the KDF itself and its root key are the vmesskdf kernel's.
SALT_AUTH_ID = b"AES Auth ID Encryption"
SALT_HEADER_LEN_KEY = b"VMess Header AEAD Key_Length"
SALT_HEADER_LEN_NONCE = b"VMess Header AEAD Nonce_Length"
SALT_HEADER_KEY = b"VMess Header AEAD Key"
SALT_HEADER_NONCE = b"VMess Header AEAD Nonce"
SALT_RESP_LEN_KEY = b"AEAD Resp Header Len Key"
SALT_RESP_LEN_IV = b"AEAD Resp Header Len IV"
SALT_RESP_KEY = b"AEAD Resp Header Key"
SALT_RESP_IV = b"AEAD Resp Header IV"

TAG_SIZE = 16  # AES-GCM and ChaCha20-Poly1305 tags
NONCE_SIZE = 12  # AEAD nonce size for both body ciphers
SIZE_BYTES = 2  # a chunk length is a big-endian uint16
MAX_PAYLOAD = 16 * 1024  # our chunk payload bound (v2ray reads chunks up to 64 KiB)
_SEALED_LEN = SIZE_BYTES + TAG_SIZE  # the sealed header length fields
_MAX_RESPONSE_HEADER = 4 + 255  # check, option, command id, command length + command body
KEY_CACHE = 256  # ids whose command key and auth-id cipher are kept (a node has one id)


class Security(enum.IntEnum):
    """Body security as the request header's low nibble (common/protocol/headers.proto)."""

    AES_128_GCM = 3
    CHACHA20_POLY1305 = 4
    NONE = 5


SECURITIES: dict[str, Security] = {
    "aes-128-gcm": Security.AES_128_GCM,
    "chacha20-poly1305": Security.CHACHA20_POLY1305,
    "none": Security.NONE,
    # v2ray's "auto" picks AES-GCM on hardware with AES instructions, as this is.
    "auto": Security.AES_128_GCM,
}
SECURITY_NAMES = {security: name for name, security in SECURITIES.items() if name != "auto"}


# --- errors ----------------------------------------------------------------------


class VmessError(CodecError):
    """VMess bytes or settings were refused; ``reason`` is a stable slug."""

    protocol = "vmess"


class VmessAuthError(VmessError):
    """A tag did not verify or the response check byte differs: wrong UUID, or altered bytes."""


class VmessProtocolError(VmessError):
    """The bytes authenticate (or cannot be checked) but break the framing rules."""


def check_alter_id(n: int) -> None:
    """Refuse ``alterId > 0``: it selects the legacy MD5 header, which honk does not speak."""
    if n < 0:
        raise VmessError("bad-alter-id", "alterId cannot be negative")
    if n > 0:
        raise VmessError(
            "legacy-alter-id",
            "alterId > 0 selects the legacy MD5 header, which is not supported; "
            "set alterId to 0 (VMess AEAD) on the server and in the node",
        )


# --- keys ------------------------------------------------------------------------


@functools.lru_cache(maxsize=KEY_CACHE)
def cmd_key(user_id: str) -> bytes:
    """``MD5(uuid bytes + VMESS_MAGIC)``; raises ``ValueError`` for a malformed UUID.
    Kept per id: every connection's header needs it."""
    try:
        raw = uuid_mod.UUID(user_id).bytes
    except (ValueError, AttributeError, TypeError):
        raise ValueError("VMess id must be a UUID") from None
    return hashlib.md5(raw + VMESS_MAGIC, usedforsecurity=False).digest()


@functools.lru_cache(maxsize=KEY_CACHE)
def _auth_id_aes(key: bytes) -> Cipher[modes.ECB]:
    """AES-128-ECB under the auth-id key derived from ``key`` (cmd_key) alone."""
    return Cipher(algorithms.AES(kdf(key, SALT_AUTH_ID)[:16]), modes.ECB())


@functools.lru_cache(maxsize=KEY_CACHE)
def _auth_id_cipher(key: bytes) -> Any:
    """The encryptor of ``key``'s auth ids: ECB keeps no state between blocks, so one context
    serves every connection of the id."""
    return _auth_id_aes(key).encryptor()


def auth_id(key: bytes, timestamp: int, rand: bytes) -> bytes:
    """The 16-byte auth id: AES-128 of ``timestamp(8) rand(4) crc32`` under a key from ``key`` (cmd_key)."""
    if len(rand) != 4:
        raise ValueError("auth id randomness is 4 bytes")
    plain = struct.pack("!q", timestamp) + rand
    plain += struct.pack("!I", zlib.crc32(plain))
    sealed: bytes = _auth_id_cipher(key).update(plain)
    return sealed


def seal_aead_header(key: bytes, header: bytes, timestamp: int, rand: bytes, nonce: bytes) -> bytes:
    """``auth_id seal(len) nonce seal(header)``: the encrypted request header."""
    if len(nonce) != 8:
        raise ValueError("connection nonce is 8 bytes")
    aid = auth_id(key, timestamp, rand)
    len_key = kdf(key, SALT_HEADER_LEN_KEY, aid, nonce)[:16]
    len_nonce = kdf(key, SALT_HEADER_LEN_NONCE, aid, nonce)[:NONCE_SIZE]
    hdr_key = kdf(key, SALT_HEADER_KEY, aid, nonce)[:16]
    hdr_nonce = kdf(key, SALT_HEADER_NONCE, aid, nonce)[:NONCE_SIZE]
    sealed_len = AESGCM(len_key).encrypt(len_nonce, struct.pack("!H", len(header)), aid)
    sealed_header = AESGCM(hdr_key).encrypt(hdr_nonce, header, aid)
    return aid + sealed_len + nonce + sealed_header


def open_aead_header(key: bytes, data: bytes) -> tuple[bytes, int]:
    """The inverse of :func:`seal_aead_header` for a complete header: ``(plaintext, timestamp)``.

    Raises :class:`VmessAuthError` when a tag fails and
    :class:`VmessProtocolError` when ``data`` is short. Checking the timestamp
    window and replays is the caller's business.
    """
    if len(data) < 16 + _SEALED_LEN + 8 + TAG_SIZE:
        raise VmessProtocolError("short-header")
    aid, sealed_len, nonce = data[:16], data[16:34], data[34:42]
    plain_id = _auth_id_aes(key).decryptor().update(aid)
    if struct.pack("!I", zlib.crc32(plain_id[:12])) != plain_id[12:]:
        raise VmessAuthError("bad-auth-id")
    try:
        raw_len = AESGCM(kdf(key, SALT_HEADER_LEN_KEY, aid, nonce)[:16]).decrypt(
            kdf(key, SALT_HEADER_LEN_NONCE, aid, nonce)[:NONCE_SIZE], sealed_len, aid
        )
        (length,) = struct.unpack("!H", raw_len)
        if len(data) != 42 + length + TAG_SIZE:
            raise VmessProtocolError("bad-header-length")
        header = AESGCM(kdf(key, SALT_HEADER_KEY, aid, nonce)[:16]).decrypt(
            kdf(key, SALT_HEADER_NONCE, aid, nonce)[:NONCE_SIZE], data[42:], aid
        )
    except InvalidTag:
        raise VmessAuthError("bad-header-tag") from None
    return header, struct.unpack("!q", plain_id[:8])[0]


def _fnv1a32(data: bytes) -> int:
    h = 0x811C9DC5  # FNV-1a 32-bit offset basis
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF  # FNV 32-bit prime
    return h


def _encode_target(target: Address) -> bytes:
    """Port, then address type and address, as VMess orders them."""
    port = struct.pack("!H", target.port)
    ip = target.ip
    if ip is None:
        raw = target.host.encode("idna") if not target.host.isascii() else target.host.encode()
        if not 0 < len(raw) <= 255:
            raise ValueError("a VMess domain must be 1..255 bytes")
        return port + bytes((ADDR_DOMAIN, len(raw))) + raw
    if ip.version == 4:
        return port + bytes((ADDR_IPV4,)) + ip.packed
    return port + bytes((ADDR_IPV6,)) + ip.packed


# --- body chunks -----------------------------------------------------------------


class _Mask:
    """The SHAKE128 stream over an IV, read two bytes at a time (option M)."""

    def __init__(self, iv: bytes) -> None:
        self._iv = iv
        self._stream = b""
        self._pos = 0

    def next(self) -> int:
        if self._pos + 2 > len(self._stream):
            # hashlib's SHAKE cannot resume squeezing; re-squeezing double the length keeps
            # the total work linear in what is read.
            self._stream = hashlib.shake_128(self._iv).digest(max(256, 2 * len(self._stream)))
        value = (self._stream[self._pos] << 8) | self._stream[self._pos + 1]
        self._pos += 2
        return value


def _cipher_key(security: Security, key: bytes) -> bytes:
    """The key the body cipher runs with: the body key, stretched for ChaCha20-Poly1305."""
    if security is Security.CHACHA20_POLY1305:
        # v2ray stretches the 16-byte body key: MD5(key) + MD5(MD5(key)).
        first = hashlib.md5(key, usedforsecurity=False).digest()
        return first + hashlib.md5(first, usedforsecurity=False).digest()
    return key


def _body_aead(security: Security, key: bytes) -> AESGCM | ChaCha20Poly1305 | None:
    if security is Security.AES_128_GCM:
        return AESGCM(key)
    if security is Security.CHACHA20_POLY1305:
        return ChaCha20Poly1305(_cipher_key(security, key))
    return None


class _ChunkCodec:
    """One body direction: the mask, the cipher and the 2-byte nonce counter."""

    def __init__(self, security: Security, key: bytes, iv: bytes) -> None:
        self.aead = _body_aead(security, key)
        self.overhead = TAG_SIZE if self.aead is not None else 0
        self.mask = _Mask(iv)
        self._iv_tail = iv[2:NONCE_SIZE]
        self._count = 0
        self.sealed = 0  # chunks sealed so far

    def _nonce(self) -> bytes:
        nonce = struct.pack("!H", self._count & 0xFFFF) + self._iv_tail
        self._count += 1
        return nonce

    def seal(self, payload: bytes) -> bytes:
        size = len(payload) + self.overhead
        self.sealed += 1
        head = struct.pack("!H", size ^ self.mask.next())
        if self.aead is None:
            return head + payload
        return head + self.aead.encrypt(self._nonce(), payload, None)

    def open(self, body: bytes) -> bytes:
        if self.aead is None:
            return body
        try:
            return self.aead.decrypt(self._nonce(), body, None)
        except InvalidTag:
            raise VmessAuthError("bad-chunk-tag") from None


# --- client ----------------------------------------------------------------------


class VmessClient:
    """The sending side of one VMess AEAD connection (TCP or UDP command).

    ``now`` (seconds since the epoch) stamps the auth id; ``random(n)`` supplies
    every random byte, so tests can pin it. The options are ``S|M`` (chunk
    stream, masked lengths) without global padding.
    """

    def __init__(
        self,
        uuid: str,
        security: str,
        command: int,
        target: Address,
        now: float,
        random: Callable[[int], bytes] = os.urandom,
    ) -> None:
        try:
            self.security = SECURITIES[security]
        except KeyError:
            raise ValueError("unknown VMess security (aes-128-gcm, chacha20-poly1305, none, auto)") from None
        if command not in (COMMAND_TCP, COMMAND_UDP):
            raise ValueError("VMess command must be TCP (1) or UDP (2)")
        self.command = command
        self.target = target
        self.cmd_key = cmd_key(uuid)
        self.options = OPTION_CHUNK_STREAM | OPTION_CHUNK_MASKING
        self._now = int(now)
        self._random = random
        self.body_iv = random(16)
        self.body_key = random(16)
        self.response_check = random(1)[0]
        # Under AEAD the response key/IV are the first 16 bytes of SHA-256 of the request's.
        self.response_key = hashlib.sha256(self.body_key).digest()[:16]
        self.response_iv = hashlib.sha256(self.body_iv).digest()[:16]
        self._writer = _ChunkCodec(self.security, self.body_key, self.body_iv)
        self._target = _encode_target(target)  # fail early on a bad domain
        self._ended = False

    def request_header(self) -> bytes:
        """The encrypted request header; send it once, before any chunk."""
        padding_len = self._random(1)[0] % 16  # v2ray rolls 0..15 padding bytes
        plain = (
            bytes((VERSION,))
            + self.body_iv
            + self.body_key
            + bytes((self.response_check, self.options, (padding_len << 4) | self.security, 0, self.command))
            + self._target
            + self._random(padding_len)
        )
        plain += struct.pack("!I", _fnv1a32(plain))
        return seal_aead_header(self.cmd_key, plain, self._now, self._random(4), self._random(8))

    def encrypt(self, data: bytes) -> bytes:
        """Chunks carrying ``data``: up to :data:`MAX_PAYLOAD` bytes each for TCP, one chunk per UDP packet.

        Empty ``data`` yields nothing for TCP (an empty chunk would end the
        stream) and is refused for UDP.
        """
        if self._ended:
            raise ValueError("the stream was already ended with eof()")
        if self.command == COMMAND_UDP:
            if not 0 < len(data) <= MAX_PAYLOAD:
                raise ValueError(f"a VMess UDP packet must be 1..{MAX_PAYLOAD} bytes")
            return self._writer.seal(bytes(data))
        view = memoryview(data)
        return b"".join(
            self._writer.seal(bytes(view[i : i + MAX_PAYLOAD])) for i in range(0, len(view), MAX_PAYLOAD)
        )

    @property
    def body_begun(self) -> bool:
        """Whether a chunk was sealed: the body's nonce count and mask have moved on."""
        return self._writer.sealed > 0

    def eof(self) -> bytes:
        """The empty chunk that ends the request direction."""
        if self._ended:
            raise ValueError("the stream was already ended with eof()")
        self._ended = True
        return self._writer.seal(b"")

    def response_decoder(self) -> VmessResponseDecoder:
        """A decoder for this connection's response stream."""
        return VmessResponseDecoder(
            self.security, self.response_key, self.response_iv, self.response_check, self.options
        )


class _Phase(enum.Enum):
    HEADER_LENGTH = "header-length"
    HEADER = "header"
    CHUNK_SIZE = "chunk-size"
    CHUNK_BODY = "chunk-body"
    ENDED = "ended"
    FAILED = "failed"


class VmessResponseDecoder:
    """The receiving side of one VMess AEAD connection: response header, then chunks.

    :meth:`feed` returns plaintext as it completes (all packets joined);
    :meth:`feed_packets` returns each chunk separately, which is what a UDP
    command needs. ``ended`` turns true at the empty terminating chunk;
    ``failed`` after any error, after which all input is refused.
    """

    def __init__(self, security: Security, key: bytes, iv: bytes, check: int, options: int) -> None:
        if options & OPTION_GLOBAL_PADDING or not options & OPTION_CHUNK_STREAM:
            raise ValueError("only the S and M options are supported")
        self._check = check
        self._masked = bool(options & OPTION_CHUNK_MASKING)
        self._reader = _ChunkCodec(security, key, iv)
        self.key, self.iv = key, iv  # the response body key and IV
        # the response header's length field and body, each sealed under its own key and nonce
        self.header_keys = (
            kdf(key, SALT_RESP_LEN_KEY)[:16],
            kdf(iv, SALT_RESP_LEN_IV)[:NONCE_SIZE],
            kdf(key, SALT_RESP_KEY)[:16],
            kdf(iv, SALT_RESP_IV)[:NONCE_SIZE],
        )
        len_key, self._len_nonce, hdr_key, self._hdr_nonce = self.header_keys
        self._len_aead = AESGCM(len_key)
        self._hdr_aead = AESGCM(hdr_key)
        self._buf = bytearray()
        self.received = 0  # bytes fed so far: none at EOF means the server never answered
        self._phase = _Phase.HEADER_LENGTH
        self._need = _SEALED_LEN
        self._last = False
        self.header_received = False

    @property
    def ended(self) -> bool:
        return self._phase is _Phase.ENDED

    @property
    def failed(self) -> bool:
        return self._phase is _Phase.FAILED

    @property
    def pending(self) -> bool:
        """Whether EOF now would cut the response short (inside its header or a chunk)."""
        return not self.header_received or bool(self._buf) or self._phase is _Phase.CHUNK_BODY

    def feed(self, data: bytes) -> bytes:
        """Plaintext completed by ``data`` (possibly empty)."""
        return b"".join(self.feed_packets(data))

    def feed_packets(self, data: bytes) -> list[bytes]:
        """The chunk payloads completed by ``data``, one item per chunk."""
        if self._phase is _Phase.FAILED:
            raise VmessProtocolError("decoder-failed", "an earlier error ended this stream")
        if self._phase is _Phase.ENDED:
            if data:
                self._phase = _Phase.FAILED
                raise VmessProtocolError("data-after-end")
            return []
        self._buf += data
        self.received += len(data)
        try:
            return self._drain()
        except VmessError:
            self._phase = _Phase.FAILED
            self._buf.clear()
            raise

    def _drain(self) -> list[bytes]:
        out: list[bytes] = []
        buf = self._buf
        pos = 0
        while len(buf) - pos >= self._need:
            piece = bytes(buf[pos : pos + self._need])
            pos += self._need
            phase = self._phase
            if phase is _Phase.HEADER_LENGTH:
                self._need = self._open_header_length(piece) + TAG_SIZE
                self._phase = _Phase.HEADER
            elif phase is _Phase.HEADER:
                self._check_header(piece)
                self._phase, self._need = _Phase.CHUNK_SIZE, SIZE_BYTES
            elif phase is _Phase.CHUNK_SIZE:
                size = (piece[0] << 8) | piece[1]
                if self._masked:
                    size ^= self._reader.mask.next()
                if size < self._reader.overhead:
                    raise VmessProtocolError("short-chunk", f"{size} bytes")
                # A chunk with no payload (an empty seal, its tag still checked) ends the stream.
                self._last = size == self._reader.overhead
                self._phase, self._need = _Phase.CHUNK_BODY, size
            else:  # CHUNK_BODY
                plain = self._reader.open(piece)
                if self._last:
                    self._phase = _Phase.ENDED
                    if len(buf) > pos:
                        raise VmessProtocolError("data-after-end")
                    break
                out.append(plain)
                self._phase, self._need = _Phase.CHUNK_SIZE, SIZE_BYTES
        del buf[:pos]
        return out

    def _open_header_length(self, sealed: bytes) -> int:
        try:
            raw = self._len_aead.decrypt(self._len_nonce, sealed, None)
        except InvalidTag:
            raise VmessAuthError("bad-response-length-tag") from None
        length: int = struct.unpack("!H", raw)[0]
        if not 4 <= length <= _MAX_RESPONSE_HEADER:
            raise VmessProtocolError("bad-response-header-length", f"{length} bytes")
        return length

    def _check_header(self, sealed: bytes) -> None:
        try:
            header = self._hdr_aead.decrypt(self._hdr_nonce, sealed, None)
        except InvalidTag:
            raise VmessAuthError("bad-response-header-tag") from None
        if header[0] != self._check:
            raise VmessAuthError("response-check-mismatch")
        # header[1] echoes the options; header[2:4] a dynamic-port command (legacy only), ignored.
        if header[2] != 0 and len(header) < 4 + header[3]:
            raise VmessProtocolError("truncated-response-command")
        self.header_received = True


# --- the relay's view ------------------------------------------------------------


class VmessFraming:
    """What the relay applies to a dialed VMess TCP stream (``DialedStream.framing``).

    The request header is already sent; the body starts here: client bytes are
    sealed as chunks from the first, the server's bytes open with its response
    header. Both relay engines carry it: the compiled one from
    :meth:`engine_keys` (no Python per chunk), the twin and the asyncio copy
    relay through ``encryptor``/``decryptor`` themselves.
    """

    kind: ClassVar[Literal["vmess"]] = "vmess"
    errors: tuple[type[HonkError], ...] = (VmessError,)
    auth_errors: tuple[type[HonkError], ...] = (VmessAuthError,)

    def __init__(self, client: VmessClient) -> None:
        if client.command != COMMAND_TCP:
            raise ValueError("only a TCP command's body is relayed as a stream")
        self.encryptor = client
        self.decryptor = client.response_decoder()

    @property
    def answered(self) -> bool:
        """Whether any byte of the server's response arrived."""
        return self.decryptor.received > 0

    def end(self) -> bytes:
        """What the client's EOF sends before the upstream's FIN: the empty chunk."""
        return self.encryptor.eof()

    # -- inside TLS (honk.proto.tls_framing.TlsFraming takes it as its ``response``) --

    @property
    def pending(self) -> bool:
        """Whether an EOF now cuts the response short (inside its header or a chunk)."""
        return self.decryptor.pending

    def feed(self, data: bytes) -> bytes:
        """The server's plaintext completed by ``data``, the response stream's next bytes."""
        return self.decryptor.feed(data)

    def engine_keys(self) -> tuple[str, bytes, bytes, bytes, bytes, bytes, bytes, bytes, bytes, int]:
        """(security, request key, request IV, response key, response IV, the response header's
        length key and nonce, its key and nonce, check byte), for a body not yet begun."""
        client, decoder = self.encryptor, self.decryptor
        if client.body_begun or decoder.received:
            raise ValueError("framing: the VMess body has already begun")
        return (
            SECURITY_NAMES[client.security],
            _cipher_key(client.security, client.body_key),
            client.body_iv,
            _cipher_key(client.security, decoder.key),
            decoder.iv,
            *decoder.header_keys,
            client.response_check,
        )

    def error_for(self, err: int) -> HonkError:
        """The typed error for a relay engine's FRAMING_* errno."""
        if err == errno.EBADMSG:
            return VmessAuthError("bad-tag", "a response header or chunk did not verify")
        if err == errno.ENOMSG:
            return VmessProtocolError("no-response", "the server closed before answering (wrong id?)")
        if err == errno.ENODATA:
            return VmessProtocolError("truncated", "the server closed inside its response header or a chunk")
        return VmessProtocolError("bad-framing", "the response broke VMess framing")
