"""Small MaxMind DB (``.mmdb``) files the tests build themselves, written from the public format
specification (https://maxmind.github.io/MaxMind-DB/), in the shape of GeoLite2-Country and
DB-IP's country files: an IPv6 search tree with IPv4 at ``::/96`` (aliased from
``::ffff:0:0/96`` and ``2002::/16`` as MaxMind's writer does), records ``{"country": {"iso_code",
"names"}, "registered_country": …}`` shared by every network of a country, and the metadata map
after ``\\xab\\xcd\\xefMaxMind.com``. A test reads one back with the ``maxminddb`` library to
prove the writer right, so what honk reads is what the library reads."""

from __future__ import annotations

import ipaddress
import struct
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

METADATA_MARKER = b"\xab\xcd\xefMaxMind.com"
DATA_SEPARATOR = bytes(16)  # between the search tree and the data section
BUILD_EPOCH = 1_700_000_000

# data field types (the control byte's top three bits; above 7: "extended", stored as type - 7)
POINTER, UTF8, DOUBLE, BYTES, UINT16, UINT32, MAP = 1, 2, 3, 4, 5, 6, 7
INT32, UINT64, UINT128, ARRAY, BOOLEAN = 8, 9, 10, 11, 14

EMPTY = -1  # a record with no data, while building; data record k is stored as -2 - k

NAMES = {"CN": "China", "US": "United States", "JP": "Japan", "DE": "Germany"}
# a few networks per country, both families; one JP network registered to US (a record's
# "registered_country" is not its country)
NETWORKS: list[tuple[str, str]] = [
    ("1.0.1.0/24", "CN"),
    ("1.0.8.0/21", "CN"),
    ("36.96.0.0/11", "CN"),
    ("240e::/20", "CN"),
    ("8.8.8.0/24", "US"),
    ("3.0.0.0/9", "US"),
    ("2600::/12", "US"),
    ("1.0.16.0/20", "JP"),
    ("133.0.0.0/8", "JP"),
    ("2400:4000::/22", "JP"),
    ("45.76.0.0/16", "JP/US"),
]


def country_record(code: str) -> dict[str, Any]:
    """A GeoLite2-Country record; ``"JP/US"``: in JP, registered to US."""
    country, _, registered = code.partition("/")
    registered = registered or country

    def place(c: str) -> dict[str, Any]:
        return {"geoname_id": 1_000 + sum(map(ord, c)), "iso_code": c, "names": {"en": NAMES.get(c, c)}}

    return {
        "continent": {"code": "AS", "geoname_id": 6_255_147, "names": {"en": "Asia"}},
        "country": place(country),
        "registered_country": place(registered),
    }


# --- the data section ---------------------------------------------------------------


def _control(kind: int, size: int) -> bytes:
    """A field's control byte(s): type and size, then the extended type, then the longer size."""
    if size < 29:
        low, more = size, b""
    elif size < 29 + 256:
        low, more = 29, bytes([size - 29])
    elif size < 285 + 65_536:
        low, more = 30, (size - 285).to_bytes(2, "big")
    else:
        low, more = 31, (size - 65_821).to_bytes(3, "big")
    if kind <= MAP:
        return bytes([(kind << 5) | low]) + more
    return bytes([low, kind - 7]) + more


class Typed(bytes):
    """A value already encoded with its type fixed (libmaxminddb insists on the metadata's)."""


def uint(kind: int, value: int) -> Typed:
    raw = value.to_bytes((value.bit_length() + 7) // 8, "big")  # leading zeros dropped
    return Typed(_control(kind, len(raw)) + raw)


def encode(value: Any) -> bytes:
    """One value in the data section's encoding (no pointers: each record is written whole)."""
    if isinstance(value, Typed):
        return bytes(value)
    if isinstance(value, bool):
        return _control(BOOLEAN, int(value))
    if isinstance(value, str):
        raw = value.encode()
        return _control(UTF8, len(raw)) + raw
    if isinstance(value, bytes):
        return _control(BYTES, len(value)) + value
    if isinstance(value, float):
        return _control(DOUBLE, 8) + struct.pack(">d", value)
    if isinstance(value, int):
        if value < 0:
            return _control(INT32, 4) + value.to_bytes(4, "big", signed=True)
        return uint(
            UINT16
            if value < 1 << 16
            else UINT32
            if value < 1 << 32
            else UINT64
            if value < 1 << 64
            else UINT128,
            value,
        )
    if isinstance(value, Mapping):
        return _control(MAP, len(value)) + b"".join(encode(str(k)) + encode(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return _control(ARRAY, len(value)) + b"".join(encode(v) for v in value)
    raise TypeError(f"no MaxMind DB type for {type(value).__name__}")


# --- the search tree -----------------------------------------------------------------


class _Tree:
    """A binary trie over 128-bit (or 32-bit) addresses; node 0 is the root."""

    def __init__(self, bits: int) -> None:
        self.bits = bits
        self.left = [EMPTY]
        self.right = [EMPTY]

    def _node(self) -> int:
        self.left.append(EMPTY)
        self.right.append(EMPTY)
        return len(self.left) - 1

    def put(self, address: int, prefix: int, ref: int, *, root: int = 0, bits: int = 0) -> None:
        """Make the record at ``address/prefix`` ``ref`` (a node, or a data record -2 - k),
        counting from node ``root`` in a ``bits``-bit space (default: the whole tree)."""
        bits = bits or self.bits
        if not 0 < prefix <= bits:
            raise ValueError(f"prefix /{prefix} cannot be written")
        node = root
        for depth in range(prefix):
            side = self.right if (address >> (bits - 1 - depth)) & 1 else self.left
            if depth == prefix - 1:
                side[node] = ref
                return
            child = side[node]
            if child < 0:
                if child != EMPTY:
                    raise ValueError("overlapping networks")
                child = side[node] = self._node()
            node = child

    def path_node(self, depth: int) -> int:
        """The node reached by ``depth`` zero bits, made if missing."""
        node = 0
        for _ in range(depth):
            child = self.left[node]
            if child < 0:
                child = self.left[node] = self._node()
            node = child
        return node


def mmdb_bytes(
    networks: Iterable[tuple[str, Any]] = NETWORKS,
    *,
    ip_version: int = 6,
    record_size: int = 24,
    aliases: bool = True,
    database_type: str = "GeoLite2-Country",
) -> bytes:
    """A database of ``(cidr, record)`` pairs (a cidr as text or an ``ipaddress`` network); a
    record given as a code string is :func:`country_record` of it. Networks must not overlap."""
    tree = _Tree(128 if ip_version == 6 else 32)
    data = bytearray()
    offsets: dict[bytes, int] = {}  # identical records are written once and shared
    by_code: dict[str, bytes] = {}
    ipv4 = -1  # the node at ::/96 of an IPv6 tree, made with the first IPv4 network
    for cidr, record in networks:
        net = ipaddress.ip_network(cidr)
        if isinstance(record, str):
            raw = by_code.get(record) or by_code.setdefault(record, encode(country_record(record)))
        else:
            raw = encode(record)
        if raw not in offsets:
            offsets[raw] = len(data)
            data += raw
        ref = -2 - offsets[raw]
        if net.version == 4 and ip_version == 6:
            if ipv4 < 0:
                ipv4 = tree.path_node(96)
            tree.put(int(net.network_address), net.prefixlen, ref, root=ipv4, bits=32)  # IPv4 at ::/96
        elif net.version == 6 and ip_version == 4:
            raise ValueError("an IPv4 database holds no IPv6 network")
        else:
            tree.put(int(net.network_address), net.prefixlen, ref)
    if ipv4 >= 0 and aliases:
        tree.put(0xFFFF << 32, 96, ipv4)  # ::ffff:0:0/96
        tree.put(0x2002 << 112, 16, ipv4)  # 2002::/16 (6to4)
    node_count = len(tree.left)

    def value(ref: int) -> int:
        if ref >= 0:
            return ref
        return node_count if ref == EMPTY else node_count + len(DATA_SEPARATOR) + (-2 - ref)

    out = bytearray()
    for left, right in zip(tree.left, tree.right, strict=True):
        a, b = value(left), value(right)
        if record_size == 24:
            out += a.to_bytes(3, "big") + b.to_bytes(3, "big")
        elif record_size == 28:
            out += (
                a.to_bytes(4, "big")[1:]
                + bytes([((a >> 24) << 4) | (b >> 24)])
                + (b & 0xFFFFFF).to_bytes(3, "big")
            )
        elif record_size == 32:
            out += a.to_bytes(4, "big") + b.to_bytes(4, "big")
        else:
            raise ValueError(f"record size {record_size}")
    metadata = {
        "binary_format_major_version": uint(UINT16, 2),
        "binary_format_minor_version": uint(UINT16, 0),
        "build_epoch": uint(UINT64, BUILD_EPOCH),
        "database_type": database_type,
        "description": {"en": "honk test database"},
        "ip_version": uint(UINT16, ip_version),
        "languages": ["en"],
        "node_count": uint(UINT32, node_count),
        "record_size": uint(UINT16, record_size),
    }
    return bytes(out) + DATA_SEPARATOR + bytes(data) + METADATA_MARKER + encode(metadata)


def write_mmdb(path: Path, networks: Iterable[tuple[str, Any]] = NETWORKS, **options: Any) -> Path:
    """:func:`mmdb_bytes` written to ``path`` (its directory made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(mmdb_bytes(networks, **options))
    return path
