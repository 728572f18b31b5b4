"""Domain sniffing from a flow's first bytes: TLS ClientHello SNI, HTTP Host, and the SNI of
a QUIC Initial (decrypted with the keys every observer can derive from the packet itself).

Sans-I/O: each function takes the bytes seen so far and answers with the domain, with
:data:`NEED_MORE` (a prefix of something sniffable), or with ``None`` (not this protocol,
or it names no domain). Malformed input never raises; the caller routes by IP then.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final

NEED_MORE: Final = "need-more"  # a prefix: read more (within the sniffing timeout) and ask again

MAX_HTTP_HEAD = 8192  # bytes of an HTTP request head sniffing looks at
MAX_CLIENT_HELLO = 65536  # bytes of TLS handshake data sniffing reassembles
MAX_HOSTNAME = 253  # a DNS name's longest text form

TLS_HANDSHAKE = 22
CLIENT_HELLO = 1
EXT_SERVER_NAME = 0
HOST_NAME = 0

HTTP_METHODS = (
    b"GET ",
    b"POST ",
    b"HEAD ",
    b"PUT ",
    b"DELETE ",
    b"OPTIONS ",
    b"PATCH ",
    b"CONNECT ",
    b"TRACE ",
)

# QUIC versions whose Initial keys are public: (salt, key label, iv label, hp label)
QUIC_V1 = 0x00000001
QUIC_V2 = 0x6B3343CF
QUIC_INITIAL_SALTS: Final = {
    QUIC_V1: (bytes.fromhex("38762cf7f55934b34d179ae6a4c80cadccbb7f0a"), b"quic key", b"quic iv", b"quic hp"),
    QUIC_V2: (
        bytes.fromhex("0dede3def700a6db819381be6e269dcbf9bd2ed9"),
        b"quicv2 key",
        b"quicv2 iv",
        b"quicv2 hp",
    ),
}
AEAD_TAG = 16
HP_SAMPLE = 16
PN_OFFSET_FOR_SAMPLE = 4  # "the sample is taken as if the packet number were four bytes"


def _clean_hostname(raw: bytes) -> str | None:
    try:
        name = raw.decode("ascii").rstrip(".").lower()
    except UnicodeDecodeError:
        return None
    if not name or len(name) > MAX_HOSTNAME or any(c.isspace() or c in "/\\@" for c in name):
        return None
    return name


# --- TLS -------------------------------------------------------------------------------------------


def client_hello_sni(hello: bytes) -> str | None:
    """The server_name of a ClientHello message body (after its 4-byte handshake header)."""
    try:
        pos = 2 + 32  # legacy_version, random
        pos += 1 + hello[pos]  # legacy_session_id
        (suites,) = struct.unpack_from("!H", hello, pos)
        pos += 2 + suites
        pos += 1 + hello[pos]  # legacy_compression_methods
        if pos == len(hello):
            return None  # no extensions
        (ext_total,) = struct.unpack_from("!H", hello, pos)
        pos += 2
        end = min(len(hello), pos + ext_total)
        while pos + 4 <= end:
            ext_type, ext_len = struct.unpack_from("!HH", hello, pos)
            pos += 4
            if ext_type == EXT_SERVER_NAME:
                (list_len,) = struct.unpack_from("!H", hello, pos)
                item, item_end = pos + 2, min(pos + 2 + list_len, pos + ext_len)
                while item + 3 <= item_end:
                    name_type, name_len = hello[item], struct.unpack_from("!H", hello, item + 1)[0]
                    if name_type == HOST_NAME:
                        return _clean_hostname(hello[item + 3 : item + 3 + name_len])
                    item += 3 + name_len
                return None
            pos += ext_len
    except (IndexError, struct.error):
        return None
    return None


def _handshake_client_hello(handshake: bytes) -> str | None:
    """SNI of a ClientHello at the start of a handshake byte stream; NEED_MORE if it is cut."""
    if len(handshake) < 4:
        return NEED_MORE
    if handshake[0] != CLIENT_HELLO:
        return None
    length = int.from_bytes(handshake[1:4], "big")
    if length > MAX_CLIENT_HELLO:
        return None
    if len(handshake) < 4 + length:
        return NEED_MORE
    return client_hello_sni(handshake[4 : 4 + length])


def sniff_tls(data: bytes) -> str | None:
    """The SNI of a TLS ClientHello in the first bytes of a TCP stream (records reassembled)."""
    handshake = bytearray()
    pos = 0
    while True:
        if len(data) - pos < 5:
            break
        content_type, major, _minor, length = (
            data[pos],
            data[pos + 1],
            data[pos + 2],
            struct.unpack_from("!H", data, pos + 3)[0],
        )
        if content_type != TLS_HANDSHAKE or major != 3:
            return None
        if len(data) - pos - 5 < length:
            break
        handshake += data[pos + 5 : pos + 5 + length]
        pos += 5 + length
        found = _handshake_client_hello(bytes(handshake))
        if found != NEED_MORE:
            return found
        if len(handshake) > MAX_CLIENT_HELLO:
            return None
    if pos == 0 and len(data) >= 1 and data[0] != TLS_HANDSHAKE:
        return None
    if len(data) >= 2 and data[0] == TLS_HANDSHAKE and data[1] != 3:
        return None
    return NEED_MORE


# --- HTTP ------------------------------------------------------------------------------------------


def sniff_http(data: bytes) -> str | None:
    """The Host of an HTTP/1 request head (its port dropped)."""
    if not any(data.startswith(m) or m.startswith(data) for m in HTTP_METHODS):
        return None
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return NEED_MORE if len(data) < MAX_HTTP_HEAD else None
    for line in data[:end].split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"host":
            host = value.strip()
            if host.startswith(b"["):  # an IPv6 literal names no domain
                return None
            return _clean_hostname(host.rsplit(b":", 1)[0] if host.count(b":") == 1 else host)
    return None


# --- QUIC ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InitialKeys:
    key: bytes
    iv: bytes
    hp: bytes


def client_initial_keys(dcid: bytes, version: int = QUIC_V1) -> InitialKeys:
    """The client's Initial packet keys for a Destination Connection ID (RFC 9001 5.2), with
    aioquic's TLS 1.3 key schedule (the QUIC health probe's library, loaded on first use)."""
    from aioquic.tls import hkdf_expand_label, hkdf_extract
    from cryptography.hazmat.primitives.hashes import SHA256

    salt, key_label, iv_label, hp_label = QUIC_INITIAL_SALTS[version]
    client = hkdf_expand_label(SHA256(), hkdf_extract(SHA256(), salt, dcid), b"client in", b"", 32)
    return InitialKeys(
        *(
            hkdf_expand_label(SHA256(), client, label, b"", size)
            for label, size in ((key_label, 16), (iv_label, 12), (hp_label, 16))
        )
    )


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    first = data[pos]
    size = 1 << (first >> 6)
    value = first & 0x3F
    for i in range(1, size):
        value = (value << 8) | data[pos + i]
    return value, pos + size


def _initial_type(first: int, version: int) -> bool:
    packet_type = (first >> 4) & 0x03
    return packet_type == (1 if version == QUIC_V2 else 0)


def open_initial(packet: bytes) -> tuple[bytes, bytes, int] | None:
    """Decrypt the first QUIC packet of a datagram if it is a client Initial of a version
    with public keys: (DCID, plaintext payload, the packet's length); None otherwise."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    try:
        first = packet[0]
        if first & 0xC0 != 0xC0:  # a long header with the fixed bit
            return None
        (version,) = struct.unpack_from("!I", packet, 1)
        if version not in QUIC_INITIAL_SALTS or not _initial_type(first, version):
            return None
        pos = 5
        dcid = packet[pos + 1 : pos + 1 + packet[pos]]
        pos += 1 + packet[pos]
        pos += 1 + packet[pos]  # source connection id
        token_len, pos = _varint(packet, pos)
        pos += token_len
        length, pos = _varint(packet, pos)
        pn_offset = pos
        if len(packet) < pn_offset + length or length < PN_OFFSET_FOR_SAMPLE + HP_SAMPLE:
            return None
        keys = client_initial_keys(bytes(dcid), version)
        sample = packet[pn_offset + PN_OFFSET_FOR_SAMPLE : pn_offset + PN_OFFSET_FOR_SAMPLE + HP_SAMPLE]
        mask = Cipher(algorithms.AES(keys.hp), modes.ECB()).encryptor().update(bytes(sample))
        first_plain = first ^ (mask[0] & 0x0F)
        pn_len = (first_plain & 0x03) + 1
        pn_bytes = bytes(
            b ^ m for b, m in zip(packet[pn_offset : pn_offset + pn_len], mask[1 : 1 + pn_len], strict=True)
        )
        header = bytes((first_plain,)) + bytes(packet[1:pn_offset]) + pn_bytes
        pn = int.from_bytes(pn_bytes, "big")
        nonce = (int.from_bytes(keys.iv, "big") ^ pn).to_bytes(12, "big")
        sealed = bytes(packet[pn_offset + pn_len : pn_offset + length])
        payload = AESGCM(keys.key).decrypt(nonce, sealed, header)
        return bytes(dcid), payload, pn_offset + length
    except (IndexError, struct.error, InvalidTag, ValueError):
        return None


def crypto_frames(payload: bytes) -> list[tuple[int, bytes]] | None:
    """The (offset, data) of each CRYPTO frame in an Initial's payload; None if a frame is
    not one an Initial may carry."""
    frames = []
    pos = 0
    try:
        while pos < len(payload):
            kind = payload[pos]
            if kind == 0x00:  # PADDING
                pos += 1
            elif kind == 0x01:  # PING
                pos += 1
            elif kind in (0x02, 0x03):  # ACK
                pos += 1
                for _ in range(2):
                    _, pos = _varint(payload, pos)
                count, pos = _varint(payload, pos)
                _, pos = _varint(payload, pos)
                for _ in range(2 * count):
                    _, pos = _varint(payload, pos)
                if kind == 0x03:
                    for _ in range(3):
                        _, pos = _varint(payload, pos)
            elif kind == 0x06:  # CRYPTO
                offset, pos = _varint(payload, pos + 1)
                length, pos = _varint(payload, pos)
                frames.append((offset, payload[pos : pos + length]))
                pos += length
            elif kind == 0x1C:  # CONNECTION_CLOSE
                return frames
            else:
                return None
    except IndexError:
        return None
    return frames


@dataclass(slots=True)
class QuicSniffer:
    """Reassembles the client's first flight across Initial packets (and datagrams) until
    the ClientHello is whole: a large ClientHello (post-quantum key shares) spans two."""

    crypto: dict[int, bytes] = field(default_factory=dict)
    dcid: bytes | None = None

    def feed(self, datagram: bytes) -> str | None:
        """SNI, NEED_MORE, or None (not a client Initial, or no name)."""
        rest = datagram
        seen = False
        while rest and rest[0] & 0x80:
            opened = open_initial(rest)
            if opened is None:
                break
            dcid, payload, used = opened
            if self.dcid is not None and dcid != self.dcid:
                return None
            self.dcid = dcid
            frames = crypto_frames(payload)
            if frames is None:
                return None
            for offset, data in frames:
                if offset + len(data) > MAX_CLIENT_HELLO:
                    return None
                self.crypto[offset] = data
            seen = True
            rest = rest[used:]
        if not seen:
            return None
        stream = bytearray()
        for offset in sorted(self.crypto):
            data = self.crypto[offset]
            if offset > len(stream):
                break  # a gap: a later packet fills it
            stream[offset : offset + len(data)] = data
        return _handshake_client_hello(bytes(stream))


def sniff_quic(datagram: bytes) -> str | None:
    """The SNI of a client Initial carried whole in one datagram."""
    return QuicSniffer().feed(datagram)
