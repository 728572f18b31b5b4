"""MaxMind DB (``.mmdb``) country databases as geoip lists.

MaxMind's GeoLite2/GeoIP2 Country and City files and DB-IP's country files are what many users
already have where no ``geoip.dat`` is installed. A rule names a country code; routing wants that
code as a set of networks (the same CIDR matcher a ``geoip.dat`` list compiles into), not a
database lookup per flow. So the search tree is walked here, once per file content and code,
and every leaf whose record's ``country.iso_code`` is the code becomes a network.

``maxminddb`` (2.2 as Debian 12 ships it, and the newest) has no tree walk in 2.2, so the walk
reads the tree from the documented format (https://maxmind.github.io/MaxMind-DB/): ``node_count``
nodes of two ``record_size``-bit records; a record below ``node_count`` is a node, equal to it
means no data, above it points into the data section. The library reads the metadata and decodes
each distinct data record once (by looking up a representative address of its first leaf), so
no data-section decoder is written here.

IPv6 databases hold IPv4 at ``::/96`` and alias ``::ffff:0:0/96`` and ``2002::/16`` to the same
nodes: the IPv4 subtree is walked once, as IPv4 networks, and the aliases are skipped.
"""

from __future__ import annotations

import io
import ipaddress
from collections.abc import Callable
from typing import Any

import maxminddb

from honk.geo.dat import GeoDataError

IPV4_BITS = 32
IPV6_BITS = 128
IPV4_START_DEPTH = IPV6_BITS - IPV4_BITS  # IPv4 lives at ::/96 in an IPv6 tree
RECORD_SIZES = (24, 28, 32)  # the only sizes the format defines
NO_CODE = ""  # a record without a country (an anonymous proxy, a continent-only record)

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


class _NamedBytes(io.BytesIO):
    """The bytes already read, as the file object ``MODE_FD`` takes (it reads ``.name``)."""

    def __init__(self, data: bytes, name: str) -> None:
        super().__init__(data)
        self.name = name


def open_reader(data: bytes, name: str) -> Any:
    """The library's pure-Python reader over ``data`` (the content whose tree is walked, so the
    two can never be of different versions of the file)."""
    try:
        return maxminddb.open_database(_NamedBytes(data, name), maxminddb.MODE_FD)
    except (maxminddb.InvalidDatabaseError, ValueError, TypeError, OSError) as exc:
        raise GeoDataError("geodata-unreadable", f"not a MaxMind DB file: {exc}") from None


def country_code(record: Any) -> str:
    """A record's ``country.iso_code``, lower case (MaxMind and DB-IP Country and City records)."""
    if isinstance(record, dict):
        country = record.get("country")
        if isinstance(country, dict):
            code = country.get("iso_code")
            if isinstance(code, str):
                return code.lower()
    return NO_CODE


class MmdbCountries:
    """One ``.mmdb`` content: a country code's networks by walking its search tree."""

    __slots__ = (
        "_data",
        "_reader",
        "_node_count",
        "_node_bytes",
        "_read_node",
        "_ip_version",
        "_ipv4_start",
        "_code_of",
        "_complete",
    )

    def __init__(self, data: bytes, reader: Any) -> None:
        meta = reader.metadata()
        self._data = data
        self._reader = reader
        self._node_count = int(meta.node_count)
        record_size = int(meta.record_size)
        self._ip_version = int(meta.ip_version)
        if record_size not in RECORD_SIZES or self._ip_version not in (4, 6):
            raise GeoDataError(
                "geodata-unreadable",
                f"unsupported MaxMind DB (record size {record_size}, IPv{self._ip_version})",
            )
        self._node_bytes = record_size // 4  # two records per node
        if self._node_count * self._node_bytes > len(data):
            raise GeoDataError("geodata-unreadable", "MaxMind DB search tree runs past the end of the file")
        self._read_node = _node_reader(data, record_size)
        self._ipv4_start = self._find_ipv4_start()
        self._code_of: dict[int, str] = {}  # record value -> its country code, decoded once
        self._complete = False  # a whole walk has decoded every record: the codes are known

    def networks(self, code: str) -> tuple[IPNetwork, ...] | None:
        """The networks whose record's country is ``code`` (any case); None: no record has it."""
        code = code.strip().lower()
        if not code or (self._complete and code not in self._code_of.values()):
            return None
        found = self._walk(code)
        if not found and code not in self._code_of.values():
            return None
        return tuple(found)

    # --- the search tree ---------------------------------------------------------------

    def _find_ipv4_start(self) -> int:
        """The record reached from the root by 96 zero bits (IPv6 trees); the root for IPv4."""
        node = 0
        if self._ip_version == 4:
            return node
        for _ in range(IPV4_START_DEPTH):
            if node >= self._node_count:
                break
            node = self._read_node(node)[0]
        return node

    def _walk(self, code: str) -> list[IPNetwork]:
        """The networks of ``code``; decodes each record value not seen before on the way."""
        out: list[IPNetwork] = []
        v4 = self._ipv4_start
        if self._ip_version == 6:
            self._walk_from(0, IPV6_BITS, code, out, skip=v4 if v4 < self._node_count else -1)
        self._walk_from(v4, IPV4_BITS, code, out, skip=-1)
        self._complete = True
        self._reader = None  # every record is decoded now; its copy of the file is not needed
        return out

    def _walk_from(self, start: int, bits: int, code: str, out: list[IPNetwork], skip: int) -> None:
        """Every leaf under record ``start`` in a ``bits``-bit space; ``skip``: a node not to
        enter (the IPv4 subtree and its aliases, walked on their own)."""
        node_count = self._node_count
        read = self._read_node
        code_of = self._code_of
        make = ipaddress.IPv4Network if bits == IPV4_BITS else ipaddress.IPv6Network
        stack = [(start, 0, 0)]  # (record value, depth, the path's bits)
        while stack:
            value, depth, path = stack.pop()
            if value < node_count:
                if value == skip:
                    continue
                if depth >= bits:
                    raise GeoDataError(
                        "geodata-unreadable", "MaxMind DB search tree is deeper than an address"
                    )
                left, right = read(value)
                depth += 1
                path <<= 1
                stack.append((right, depth, path | 1))
                stack.append((left, depth, path))
                continue
            if value == node_count:
                continue  # no data
            address = path << (bits - depth)
            found = code_of.get(value)
            if found is None:
                found = code_of[value] = self._decode(address, bits)
            if found == code:
                out.append(make((address, depth)))

    def _decode(self, address: int, bits: int) -> str:
        """The country code of the record an address in a leaf network has."""
        ip = ipaddress.IPv4Address(address) if bits == IPV4_BITS else ipaddress.IPv6Address(address)
        try:
            return country_code(self._reader.get(ip))
        except (maxminddb.InvalidDatabaseError, ValueError, TypeError) as exc:
            raise GeoDataError("geodata-unreadable", f"bad MaxMind DB data record: {exc}") from None


def _node_reader(data: bytes, record_size: int) -> Callable[[int], tuple[int, int]]:
    """``node -> (left, right)`` for the record size: 24 and 32 bits are whole bytes; 28 bits
    share the middle byte, its high nibble topping the left record, its low one the right."""
    view = memoryview(data)
    frombytes = int.from_bytes
    if record_size == 24:

        def read24(node: int) -> tuple[int, int]:
            o = node * 6
            return frombytes(view[o : o + 3], "big"), frombytes(view[o + 3 : o + 6], "big")

        return read24
    if record_size == 28:

        def read28(node: int) -> tuple[int, int]:
            o = node * 7
            middle = data[o + 3]
            return (
                ((middle & 0xF0) << 20) | frombytes(view[o : o + 3], "big"),
                ((middle & 0x0F) << 24) | frombytes(view[o + 4 : o + 7], "big"),
            )

        return read28

    def read32(node: int) -> tuple[int, int]:
        o = node * 8
        return frombytes(view[o : o + 4], "big"), frombytes(view[o + 4 : o + 8], "big")

    return read32


def read_mmdb(data: bytes, name: str) -> MmdbCountries:
    """``data``, the content of the ``.mmdb`` file ``name``, ready to answer country codes."""
    return MmdbCountries(data, open_reader(data, name))
