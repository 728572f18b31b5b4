"""honk's rtnetlink decoder against pyroute2's encoder, and against garbage."""

from __future__ import annotations

import socket
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroute2.netlink.rtnl.ifaddrmsg import ifaddrmsg
from pyroute2.netlink.rtnl.ifinfmsg import ifinfmsg
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from honk.alive.rtnl import (
    NLMSG_DONE,
    NLMSG_ERROR,
    RTM_GETADDR,
    RTM_GETLINK,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTM_NEWROUTE,
    RtnlFormatError,
    dump_request,
    parse_messages,
)


def encoded(msg, kind: int, seq: int = 7) -> bytes:
    msg["header"]["type"] = kind
    msg["header"]["sequence_number"] = seq
    msg["header"]["pid"] = 4242
    msg.encode()
    return bytes(msg.data)


def test_a_link_message_decodes_its_fields_and_operstate():
    msg = ifinfmsg()
    msg["family"], msg["index"], msg["flags"] = socket.AF_UNSPEC, 9, 0x10043
    msg["attrs"] = [("IFLA_IFNAME", "veth9"), ("IFLA_OPERSTATE", "LOWERLAYERDOWN"), ("IFLA_MTU", 1500)]
    (out,) = parse_messages(encoded(msg, RTM_NEWLINK))
    assert out["header"]["type"] == RTM_NEWLINK and out["header"]["sequence_number"] == 7
    assert out["header"]["pid"] == 4242
    assert (out["index"], out["flags"]) == (9, 0x10043)
    assert out.get_attr("IFLA_OPERSTATE") == "LOWERLAYERDOWN" and out.get_attr("IFLA_IFNAME") == "veth9"


@pytest.mark.parametrize(
    ("family", "address"), [(socket.AF_INET, "192.0.2.7"), (socket.AF_INET6, "2001:db8::7")]
)
def test_an_address_message_decodes_addresses_as_text_and_the_flags_attribute(family, address):
    msg = ifaddrmsg()
    msg["family"], msg["index"], msg["prefixlen"], msg["flags"] = family, 3, 64, 0x80
    msg["attrs"] = [("IFA_ADDRESS", address), ("IFA_LOCAL", address), ("IFA_FLAGS", 0x240)]
    (out,) = parse_messages(encoded(msg, RTM_NEWADDR))
    assert (out["family"], out["index"], out["prefixlen"], out["flags"]) == (family, 3, 64, 0x80)
    assert out.get_attr("IFA_ADDRESS") == address and out.get_attr("IFA_LOCAL") == address
    assert out.get_attr("IFA_FLAGS") == 0x240


def test_a_route_message_decodes_its_table_attribute_and_flags():
    msg = rtmsg()
    msg["family"], msg["dst_len"], msg["table"], msg["flags"] = socket.AF_INET, 24, 252, 0x200
    msg["attrs"] = [("RTA_DST", "198.51.100.0"), ("RTA_TABLE", 1000)]
    (out,) = parse_messages(encoded(msg, RTM_NEWROUTE))
    assert (out["table"], out["flags"], out.get_attr("RTA_TABLE")) == (252, 0x200, 1000)


def test_several_messages_in_one_datagram_and_done_and_error():
    first = ifinfmsg()
    first["index"] = 1
    done = struct.pack("=IHHIIi", 20, NLMSG_DONE, 2, 7, 4242, 0)
    error = struct.pack("=IHHIIi", 36, NLMSG_ERROR, 0, 8, 4242, -1) + bytes(16)
    out = parse_messages(encoded(first, RTM_NEWLINK) + done + error)
    assert [m["header"]["type"] for m in out] == [RTM_NEWLINK, NLMSG_DONE, NLMSG_ERROR]
    assert out[2]["header"]["error"] == -1


def test_a_dump_request_is_what_the_kernel_expects():
    for kind, size in ((RTM_GETLINK, 32), (RTM_GETADDR, 24)):
        request = dump_request(kind, 5)
        length, got_kind, flags, seq, pid = struct.unpack_from("=IHHII", request)
        assert (length, got_kind, flags & 0x300, seq, pid) == (size, kind, 0x300, 5, 0) and len(
            request
        ) == size


@pytest.mark.parametrize(
    "data",
    [
        struct.pack("=IHHII", 8, RTM_NEWLINK, 0, 0, 0),  # length below the header
        struct.pack("=IHHII", 400, RTM_NEWLINK, 0, 0, 0),  # length past the datagram
        struct.pack("=IHHII", 20, RTM_NEWLINK, 0, 0, 0) + b"\0" * 4,  # fixed part truncated
        struct.pack("=IHHII", 36, RTM_NEWLINK, 0, 0, 0)
        + b"\0" * 16
        + struct.pack("=HH", 99, 16),  # attribute overrun
    ],
)
def test_malformed_datagrams_are_refused_with_a_typed_error(data):
    with pytest.raises(RtnlFormatError):
        parse_messages(data)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_are_refused(data):
    try:
        messages = parse_messages(data)
    except RtnlFormatError:
        return
    assert all("header" in m.fields for m in messages)
