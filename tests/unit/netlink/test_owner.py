"""The local process behind a socket (``pname`` on the host's own flows), found through the
kernel's socket tables and ``/proc``: real sockets on loopback, this test's own process."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from honk.core.net import Address, Network
from honk.netlink.owner import COMM_MAX, comm_name, process_name, socket_inode


def own_name() -> str:
    return Path("/proc/self/comm").read_text().rstrip("\n")


def address(sockname: tuple) -> Address:
    return Address(sockname[0], sockname[1])


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_tcp_clients_process_is_found_from_its_address_and_its_servers(host: str) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.create_server((host, 0), family=family) as server:
        with socket.create_connection(server.getsockname()[:2]) as client:
            accepted, _ = server.accept()
            with accepted:
                source, target = address(client.getsockname()), address(server.getsockname())
                assert process_name(Network.TCP, source, target) == own_name()
                # the accepted end has the addresses the other way round: it is not the client
                inode = socket_inode(Network.TCP, source, target)
                assert inode is not None and inode != socket_inode(Network.TCP, target, source)


def test_an_ipv4_client_on_a_dual_stack_socket_is_found_in_the_ipv6_table() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        with client:
            client.connect(("::ffff:127.0.0.1", server.getsockname()[1]))
            accepted, _ = server.accept()
            with accepted:
                source = Address("127.0.0.1", client.getsockname()[1])
                assert process_name(Network.TCP, source, address(server.getsockname())) == own_name()


def test_udp_sockets_connected_or_not_are_found() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as peer:
        peer.bind(("127.0.0.1", 0))
        target = address(peer.getsockname())
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as unconnected:
            unconnected.bind(("0.0.0.0", 0))  # noqa: S104 - any address, as a sendto() client binds
            source = Address("127.0.0.1", unconnected.getsockname()[1])
            assert process_name(Network.UDP, source, target) == own_name()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as connected:
            connected.connect(peer.getsockname())
            assert process_name(Network.UDP, address(connected.getsockname()), target) == own_name()


def test_a_flow_without_a_local_socket_has_no_process() -> None:
    # a LAN client's address: no socket of this host has it
    assert process_name(Network.TCP, Address("192.0.2.77", 40000), Address("198.51.100.2", 80)) is None
    assert process_name(Network.UDP, Address("192.0.2.77", 40000), Address("198.51.100.2", 53)) is None
    assert process_name(Network.TCP, Address("not-an-ip", 1), Address("198.51.100.2", 80)) is None


def test_names_are_compared_as_the_kernel_keeps_them() -> None:
    assert comm_name("systemd-resolved") == "systemd-resolve" and len(comm_name("x" * 40)) == COMM_MAX
    assert comm_name("curl") == "curl"
