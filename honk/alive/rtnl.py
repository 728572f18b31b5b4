"""The few rtnetlink messages the network watcher reads, decoded with ``struct``.

Importing pyroute2 loads its whole API (IPRoute, NDB, IPDB, conntrack...): about
20 MB of resident memory and a tenth of a second, paid by every honk process
for three message types. The watcher needs only the netlink header, the fixed
part of link, address and route messages and a handful of attributes, so they
are decoded here; the tests check this decoder against pyroute2's encoder.

:class:`RtMessage` answers the same questions as a parsed pyroute2 message
(``message["index"]``, ``message["header"]["type"]``, ``message.get_attr(name)``),
so the watcher's classification works on either. Values follow pyroute2's
conventions: operstates as words ("UP", "DOWN"...), addresses as text.

Nothing here does I/O.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

# <linux/netlink.h>
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
# <linux/rtnetlink.h>
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
RTM_NEWROUTE, RTM_DELROUTE = 24, 25
RTMGRP_LINK = 0x1
RTMGRP_IPV4_IFADDR = 0x10
RTMGRP_IPV4_ROUTE = 0x40
RTMGRP_IPV6_IFADDR = 0x100
RTMGRP_IPV6_ROUTE = 0x400
# <linux/if.h>, <linux/if_addr.h>
IFF_UP = 0x1
IFF_RUNNING = 0x40
IFA_F_DADFAILED = 0x08
IFA_F_DEPRECATED = 0x20
IFA_F_TENTATIVE = 0x40

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence number, port id
_ATTR = struct.Struct("=HH")  # rtattr: length, type
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefixlen, flags, scope, index
_RTMSG = struct.Struct(
    "=BBBBBBBBI"
)  # rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags
_ERROR = struct.Struct("=i")

_OPERSTATES = ("UNKNOWN", "NOTPRESENT", "DOWN", "LOWERLAYERDOWN", "TESTING", "DORMANT", "UP")  # IF_OPER_*

# (message types, fixed part, its field names, {attribute type: (name, decoder)})
_IP = "ip"
_U32, _NAME = "u32", "name"
_LINK = (
    _IFINFO,
    ("family", "ifi_type", "index", "flags", "change"),
    {3: ("IFLA_IFNAME", _NAME), 16: ("IFLA_OPERSTATE", "operstate")},
)
_ADDR = (
    _IFADDR,
    ("family", "prefixlen", "flags", "scope", "index"),
    {1: ("IFA_ADDRESS", _IP), 2: ("IFA_LOCAL", _IP), 8: ("IFA_FLAGS", _U32)},
)
_ROUTE = (
    _RTMSG,
    ("family", "dst_len", "src_len", "tos", "table", "proto", "scope", "type", "flags"),
    {15: ("RTA_TABLE", _U32)},
)
_LAYOUTS = {
    RTM_NEWLINK: _LINK,
    RTM_DELLINK: _LINK,
    RTM_NEWADDR: _ADDR,
    RTM_DELADDR: _ADDR,
    RTM_NEWROUTE: _ROUTE,
    RTM_DELROUTE: _ROUTE,
}


class RtnlFormatError(ValueError):
    """A datagram that is not well-formed rtnetlink."""


class RtMessage:
    """One decoded message: ``fields`` (with ``header``) and the attributes this module knows."""

    __slots__ = ("fields", "attrs")

    def __init__(self, fields: dict[str, Any], attrs: dict[str, Any]) -> None:
        self.fields = fields
        self.attrs = attrs

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    def get_attr(self, name: str) -> Any:
        return self.attrs.get(name)

    def __repr__(self) -> str:
        return f"RtMessage({self.fields!r}, {self.attrs!r})"


def parse_messages(data: bytes) -> list[RtMessage]:
    """Every message of one netlink datagram. Types other than link, address, route, done and
    error come back with their header only. Raises :class:`RtnlFormatError`."""
    out = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, kind, flags, seq, pid = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size or offset + length > len(data):
            raise RtnlFormatError("netlink message length out of bounds")
        header = {"length": length, "type": kind, "flags": flags, "sequence_number": seq, "pid": pid}
        body = data[offset + _HEADER.size : offset + length]
        fields: dict[str, Any] = {"header": header}
        attrs: dict[str, Any] = {}
        if kind == NLMSG_ERROR:
            if len(body) < _ERROR.size:
                raise RtnlFormatError("truncated netlink error")
            (code,) = _ERROR.unpack_from(body)
            header["error"] = code or None
        elif (layout := _LAYOUTS.get(kind)) is not None:
            fixed, names, known = layout
            if len(body) < fixed.size:
                raise RtnlFormatError("truncated rtnetlink message")
            fields.update(zip(names, fixed.unpack_from(body), strict=True))
            attrs = _attributes(body, fixed.size, known, fields.get("family", 0))
        out.append(RtMessage(fields, attrs))
        offset += _align(length)
    return out


def dump_request(kind: int, seq: int) -> bytes:
    """An ``RTM_GETLINK`` or ``RTM_GETADDR`` dump request for every family."""
    fixed = _IFINFO.pack(socket.AF_UNSPEC, 0, 0, 0, 0) if kind == RTM_GETLINK else _IFADDR.pack(0, 0, 0, 0, 0)
    return _HEADER.pack(_HEADER.size + len(fixed), kind, NLM_F_REQUEST | NLM_F_DUMP, seq, 0) + fixed


def _attributes(body: bytes, offset: int, known: dict[int, tuple[str, str]], family: int) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    offset = _align(offset)
    while offset + _ATTR.size <= len(body):
        length, kind = _ATTR.unpack_from(body, offset)
        if length < _ATTR.size or offset + length > len(body):
            raise RtnlFormatError("rtnetlink attribute length out of bounds")
        entry = known.get(kind & 0x3FFF)  # without the nested and byte-order bits
        if entry is not None:
            name, decoder = entry
            attrs[name] = _decode(body[offset + _ATTR.size : offset + length], decoder, family)
        offset += _align(length)
    return attrs


def _decode(value: bytes, decoder: str, family: int) -> Any:
    if decoder == _U32:
        return struct.unpack_from("=I", value)[0] if len(value) >= 4 else None
    if decoder == "operstate":
        state = value[0] if value else 0
        return _OPERSTATES[state] if state < len(_OPERSTATES) else str(state)
    if decoder == _NAME:
        return value.split(b"\0", 1)[0].decode("utf-8", "replace")
    if family in (socket.AF_INET, socket.AF_INET6) and len(value) == (4 if family == socket.AF_INET else 16):
        return socket.inet_ntop(family, value)
    return value.hex()


def _align(n: int) -> int:
    return (n + 3) & ~3
