"""Nodes the relay engine dials itself, against real servers (ss-server, v2ray).

A SOCKS5 CONNECT on the fast path that is routed to a Shadowsocks node, a VMess node on
plain TCP, or a Trojan, VLESS or VMess node on TCP + TLS, whose server is an IP literal, is
answered with ONE command: the engine's worker connects to the server, makes the TLS
handshake when there is one, sends the request header (the Shadowsocks salt and address
chunk it seals itself, VMess's header sealed by Python, Trojan's and VLESS's sealed into
the first record, VMess's inside TLS written as it is) and relays through the framing.
The dial is admitted, timed and reported exactly as Python's dial is (the dial permit, the
descriptor budget, the node's dial counts and health, Score), and Python dials instead when
the flow needs it: a group on the chain that retries a failed dial, a ready connection
warm-up opened, no free dial permit. Each test runs over the compiled engine and its twin.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import trustme
from helpers.aio import close_writer, rule, socks5_open
from helpers.engines import ENGINES, FASTPATH_ENGINES, fastpath_engine
from helpers.inprocess import mixed_inbound
from helpers.peers import require
from helpers.peerservers import SS_METHODS, ss_server, v2ray_server
from helpers.servers import EchoServer
from helpers.sockets import unanswered_port
from helpers.socks import encode_address
from test_tls_engine_relay import TicketingTrojanServer

from honk._fast import tlsverify
from honk.config.links import parse_node_link
from honk.config.spec import (
    GlobalSpec,
    GroupSpec,
    InboundSpec,
    NodeSpec,
    Policy,
    RoutingSpec,
    Spec,
    name_filter,
)
from honk.connection.dispatch import Dispatcher
from honk.core.clock import Clock, FakeClock, MonotonicClock
from honk.core.errors import DialTimeout
from honk.inbound import fastpath
from honk.inbound.mixed import MixedInbound
from honk.outbound.direct import ConnectFailed
from honk.outbound.tls import TlsFailed, client_context
from honk.relay.native import close_engines

STEP = 5.0
PASSWORD = "engine-dial-pw"


@pytest.fixture(params=FASTPATH_ENGINES)
def engine_name(request: pytest.FixtureRequest) -> str:
    return request.param


@dataclass
class Env:
    inbound: MixedInbound
    dispatcher: Dispatcher
    engine_dials: list[bool]  # per routed request: whether the engine dialled it (False: Python)
    refusals: list[Exception]  # the typed errors the inbound refused flows with

    @property
    def port(self) -> int:
        assert self.inbound.bound is not None
        return self.inbound.bound.port

    def leaf(self, name: str):  # noqa: ANN201 - the node's leaf
        return self.dispatcher.plane.outbounds[name]


@contextlib.asynccontextmanager
async def honk(
    engine_name: str,
    nodes: tuple[NodeSpec, ...],
    *,
    fallback: str,
    groups: tuple[GroupSpec, ...] = (),
    clock: Clock | None = None,
    max_concurrent_dials: int = 64,
) -> AsyncIterator[Env]:
    glob = GlobalSpec(connect_timeout=2.0, max_concurrent_dials=max_concurrent_dials)
    ispec = InboundSpec(name="lan", kind="mixed", host="127.0.0.1", port=0)
    spec = Spec(
        global_=glob, inbounds=(ispec,), nodes=nodes, groups=groups, routing=RoutingSpec(fallback=fallback)
    )
    async with mixed_inbound(spec, clock or MonotonicClock(), fastpath_engine(engine_name)) as (
        inbound,
        dispatcher,
    ):
        assert inbound._fast is not None
        made: list[bool] = []
        decide = dispatcher.engine_dial

        def watched(routed):  # noqa: ANN001, ANN202 - observes the real decision, changes nothing
            dial = decide(routed)
            made.append(dial is not None)
            return dial

        dispatcher.engine_dial = watched  # type: ignore[method-assign]
        refusals: list[Exception] = []
        refuse = inbound._refused

        def refused(tag, source, target, error):  # noqa: ANN001, ANN202 - observes, then the real one
            refusals.append(error)
            refuse(tag, source, target, error)

        inbound._refused = refused  # type: ignore[method-assign]
        yield Env(inbound, dispatcher, made, refusals)


def _ss_node(name: str, port: int, method: str = "aes-256-gcm") -> NodeSpec:
    return NodeSpec(name, "ss", "127.0.0.1", port, password=PASSWORD, encryption=method)


async def _echo_through(env: Env, echo_port: int, payload: bytes) -> bytes:
    reader, writer, rep, _bound = await socks5_open(env.port, "127.0.0.1", echo_port)
    try:
        assert rep == 0x00
        writer.write(payload)
        got = await asyncio.wait_for(reader.readexactly(len(payload)), STEP)
        writer.write_eof()
        assert await asyncio.wait_for(reader.read(), STEP) == b""
        return got
    finally:
        await close_writer(writer)


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- the engine dials ----------------------------------------------------------------------------


@pytest.mark.parametrize("method", SS_METHODS)
def test_a_shadowsocks_node_is_dialled_by_the_engine_and_carries_both_ways(run, engine_name, method) -> None:
    payload = bytes(range(256)) * 512  # 128 KiB: several chunks each way

    async def main() -> None:
        with ss_server(method, PASSWORD, udp=False) as peer, EchoServer() as echo:
            async with honk(engine_name, (_ss_node("ss", peer.port, method),), fallback="ss") as env:
                for _ in range(3):
                    assert await _echo_through(env, echo.port, payload) == payload
                await asyncio.wait_for(env.inbound.wait_closed(), STEP)
                assert env.engine_dials == [True, True, True]
                assert env.leaf("ss").runtime.dials["ok"] == 3

    run(main())


def test_a_vmess_node_on_plain_tcp_is_dialled_by_the_engine(run, engine_name) -> None:
    async def main() -> None:
        with v2ray_server("vmess") as peer, EchoServer() as echo:
            node = parse_node_link(peer.share_link(), "vm")
            async with honk(engine_name, (node,), fallback="vm") as env:
                assert await _echo_through(env, echo.port, b"vmess through the engine" * 100) == (
                    b"vmess through the engine" * 100
                )
                assert env.engine_dials == [True]
                assert env.leaf("vm").runtime.dials["ok"] == 1
            assert any(f"127.0.0.1:{echo.port}" in line for line in peer.accepted())

    run(main())


def test_a_connect_finished_within_connect_opens_the_flow_in_the_same_turn(run, engine_name) -> None:
    """Over loopback the kernel finishes the handshake inside connect(): the engine opens the
    flow then (the SOCKS reply, the request header), not after a readiness turn, which under
    load cost every short flow a few hundred microseconds. A connect still in progress (the
    server's backlog is full) waits for its readiness and is not counted."""

    async def main() -> None:
        with ss_server("aes-256-gcm", PASSWORD, udp=False) as peer, EchoServer() as echo:
            async with honk(engine_name, (_ss_node("ss", peer.port),), fallback="ss") as env:
                engine = env.inbound._fast.paths[0].engine
                for i in range(3):
                    assert await _echo_through(env, echo.port, b"opened at once") == b"opened at once"
                    assert engine.connects_at_once == i + 1
        clock = FakeClock()
        with unanswered_port() as port:
            async with honk(engine_name, (_ss_node("ss", port),), fallback="ss", clock=clock) as env:
                engine = env.inbound._fast.paths[0].engine
                reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
                writer.write(b"\x05\x01\x00\x05\x01\x00" + encode_address("127.0.0.1", 80))
                assert await asyncio.wait_for(reader.readexactly(2), STEP) == b"\x05\x00"
                while clock.sleepers == 0:  # the connect deadline is armed
                    await asyncio.sleep(0.001)
                clock.advance(2.1)  # the cancel reaches the worker after its connect command
                assert (await asyncio.wait_for(reader.readexactly(10), STEP))[1] == 0x06
                await close_writer(writer)
                await asyncio.wait_for(env.inbound.wait_closed(), STEP)
                assert engine.connects_at_once == 0

    run(main())


# --- failures are reported as Python's dial reports them -------------------------------------------


def test_an_unreachable_node_gets_reply_5_and_is_charged_with_the_connect(run, engine_name, caplog) -> None:
    caplog.set_level(logging.INFO, logger="honk.inbound")
    port = _closed_port()

    async def main() -> None:
        async with honk(engine_name, (_ss_node("ss", port),), fallback="ss") as env:
            reader, writer, rep, _ = await socks5_open(env.port, "127.0.0.1", 80)
            assert rep == 0x05
            assert await asyncio.wait_for(reader.read(), STEP) == b""
            await close_writer(writer)
            await asyncio.wait_for(env.inbound.wait_closed(), STEP)
            assert env.engine_dials == [True]
            assert env.leaf("ss").runtime.dials["connect"] == 1
            assert env.dispatcher.plane.admission.in_use == 0  # the permit went back
            [error] = env.refusals
            assert isinstance(error, ConnectFailed) and f"127.0.0.1:{port}" in str(error), error

    run(main())
    refused = [r.getMessage() for r in caplog.records if "flow refused inbound=lan" in r.getMessage()]
    assert len(refused) == 1
    assert "error=ConnectFailed" in refused[0]


def test_a_node_silent_past_the_connect_deadline_gets_reply_6_on_the_injected_clock(run, engine_name) -> None:
    async def main() -> None:
        clock = FakeClock()
        with unanswered_port() as port:
            node = _ss_node("ss", port)
            async with honk(engine_name, (node,), fallback="ss", clock=clock) as env:
                reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
                writer.write(b"\x05\x01\x00\x05\x01\x00" + encode_address("127.0.0.1", 80))
                assert await asyncio.wait_for(reader.readexactly(2), STEP) == b"\x05\x00"
                while clock.sleepers == 0:  # the connect deadline is armed
                    await asyncio.sleep(0.001)
                clock.advance(2.1)
                head = await asyncio.wait_for(reader.readexactly(10), STEP)
                assert head[1] == 0x06
                await close_writer(writer)
                await asyncio.wait_for(env.inbound.wait_closed(), STEP)
                assert env.engine_dials == [True]
                assert env.leaf("ss").runtime.dials["connect"] == 1  # a timeout with its full share counts
                assert env.dispatcher.plane.admission.in_use == 0

    run(main())


# --- when Python dials instead -----------------------------------------------------------------------


@pytest.mark.parametrize("policy", [Policy.URLTEST, Policy.FALLBACK, Policy.SCORE])
def test_a_node_picked_by_a_group_that_retries_is_dialled_by_python(run, engine_name, policy) -> None:
    """A failed first dial of such a group's pick gets a retry round on another member: that
    needs the client still unanswered, which only Python's dial keeps."""

    async def main() -> None:
        with ss_server("aes-128-gcm", PASSWORD, udp=False) as peer, EchoServer() as echo:
            nodes = (_ss_node("n1", peer.port, "aes-128-gcm"), _ss_node("n2", peer.port, "aes-128-gcm"))
            group = GroupSpec(
                "pick", policy=policy, filters=(name_filter("n1", "n2"),), has_filter_lines=True
            )
            async with honk(engine_name, nodes, fallback="pick", groups=(group,)) as env:
                assert await _echo_through(env, echo.port, b"retry-capable") == b"retry-capable"
                assert env.engine_dials == [False]

    run(main())


def test_a_node_under_a_selector_group_is_dialled_by_the_engine(run, engine_name) -> None:
    async def main() -> None:
        with ss_server("aes-128-gcm", PASSWORD, udp=False) as peer, EchoServer() as echo:
            nodes = (_ss_node("n1", peer.port, "aes-128-gcm"),)
            group = GroupSpec(
                "pick", policy=Policy.SELECTOR, filters=(name_filter("n1"),), has_filter_lines=True
            )
            async with honk(engine_name, nodes, fallback="pick", groups=(group,)) as env:
                assert await _echo_through(env, echo.port, b"selected") == b"selected"
                assert env.engine_dials == [True]

    run(main())


def test_without_a_free_dial_permit_python_dials_once_one_is_released(run, engine_name) -> None:
    async def main() -> None:
        with ss_server("aes-256-gcm", PASSWORD, udp=False) as peer, EchoServer() as echo:
            async with honk(
                engine_name, (_ss_node("ss", peer.port),), fallback="ss", max_concurrent_dials=1
            ) as env:
                held = env.dispatcher.plane.admission.try_acquire()
                assert held is not None
                opening = asyncio.ensure_future(socks5_open(env.port, "127.0.0.1", echo.port))
                while not env.engine_dials:
                    await asyncio.sleep(0.001)
                assert env.engine_dials == [False]  # the engine does not wait for a permit
                await asyncio.sleep(0.05)
                assert not opening.done()  # Python's dial waits its turn
                held.release()
                reader, writer, rep, _ = await asyncio.wait_for(opening, STEP)
                assert rep == 0x00
                writer.write(b"after the wait")
                assert await asyncio.wait_for(reader.readexactly(14), STEP) == b"after the wait"
                await close_writer(writer)

    run(main())


def test_a_ready_connection_warm_up_opened_is_used_by_python_not_bypassed(run, engine_name) -> None:
    async def main() -> None:
        with ss_server("aes-256-gcm", PASSWORD, udp=False) as peer, EchoServer() as echo:
            async with honk(engine_name, (_ss_node("ss", peer.port),), fallback="ss") as env:
                ready = env.leaf("ss").runtime.ready
                sock = socket.create_connection(("127.0.0.1", peer.port))
                sock.setblocking(False)
                assert ready.deposit(sock, env.dispatcher.clock.now())
                assert await _echo_through(env, echo.port, b"warm") == b"warm"
                assert await _echo_through(env, echo.port, b"cold") == b"cold"
                assert env.engine_dials == [False, True]
                assert ready.hits == 1

    run(main())


# --- Trojan, VLESS and VMess over TLS: the engine makes the handshake ------------------------------


@pytest.mark.parametrize("protocol", ["trojan", "vless", "vmess"])
def test_a_tls_node_is_dialled_and_its_handshake_made_by_the_engine(
    run, engine_name, protocol, monkeypatch
) -> None:
    payload = bytes(range(256)) * 256

    async def main() -> None:
        with v2ray_server(protocol, transport="tcp", tls=True) as peer, EchoServer() as echo:
            monkeypatch.setenv("SSL_CERT_FILE", str(peer.ca_path))
            node = parse_node_link(peer.share_link(), "tls")
            async with honk(engine_name, (node,), fallback="tls") as env:
                for _ in range(2):
                    assert await _echo_through(env, echo.port, payload) == payload
                await asyncio.wait_for(env.inbound.wait_closed(), STEP)
                assert env.engine_dials == [True, True]
                assert env.leaf("tls").runtime.dials["ok"] == 2
            assert len([line for line in peer.accepted() if f"127.0.0.1:{echo.port}" in line]) == 2

    run(main())


def test_the_servers_chain_is_verified_once_for_a_burst_of_handshakes(run, engine_name, monkeypatch) -> None:
    """Compiled builds keep a verified chain (honk._fast.tlsverify): the handshakes after the
    first, made by the engine's worker or by Python, accept it without verifying it again."""

    async def main() -> None:
        with v2ray_server("trojan", transport="tcp", tls=True) as peer, EchoServer() as echo:
            monkeypatch.setenv("SSL_CERT_FILE", str(peer.ca_path))
            node = parse_node_link(peer.share_link(), "tls")
            async with honk(engine_name, (node,), fallback="tls") as env:
                assert await _echo_through(env, echo.port, b"verified once") == b"verified once"
                # the rest at once (the server holds each flow's side a second after it is done)
                burst = [_echo_through(env, echo.port, b"verified once") for _ in range(3)]
                assert await asyncio.gather(*burst) == [b"verified once"] * 3
                await asyncio.wait_for(env.inbound.wait_closed(), STEP)
                context = client_context(True, (), "", "tls", MonotonicClock().now())
                hits, misses = tlsverify.stats(context)
                if tlsverify.IMPLEMENTATION == "compiled":
                    assert (hits, misses) == (3, 1)
                else:
                    assert (hits, misses) == (0, 0)
                assert env.leaf("tls").runtime.dials["ok"] == 4

    run(main())


@pytest.mark.parametrize(
    ("sni", "reason"), [("localhost", "certificate-untrusted"), ("elsewhere.test", "certificate-name")]
)
def test_a_certificate_the_engine_does_not_accept_is_a_typed_tls_failure_and_reply_1(
    run, engine_name, caplog, monkeypatch, tmp_path, sni, reason
) -> None:
    caplog.set_level(logging.INFO, logger="honk.inbound")

    async def main() -> None:
        with v2ray_server("trojan", transport="tcp", tls=True) as peer, EchoServer() as echo:
            if reason == "certificate-untrusted":  # a store without the server's CA
                other = trustme.CA()
                other.cert_pem.write_to_path(str(tmp_path / "other.pem"))
                monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "other.pem"))
            else:
                monkeypatch.setenv("SSL_CERT_FILE", str(peer.ca_path))
            node = parse_node_link(peer.share_link(sni=sni), "tls")
            async with honk(engine_name, (node,), fallback="tls") as env:
                reader, writer, rep, _ = await socks5_open(env.port, "127.0.0.1", echo.port)
                assert rep == 0x01
                assert await asyncio.wait_for(reader.read(), STEP) == b""
                await close_writer(writer)
                await asyncio.wait_for(env.inbound.wait_closed(), STEP)
                assert env.engine_dials == [True]
                assert env.leaf("tls").runtime.dials["tls"] == 1
                assert env.dispatcher.plane.admission.in_use == 0
                [error] = env.refusals
                assert isinstance(error, TlsFailed) and error.reason == reason, error
            assert not peer.accepted()

    run(main())
    refused = [r.getMessage() for r in caplog.records if "flow refused inbound=lan" in r.getMessage()]
    assert len(refused) == 1 and "error=TlsFailed" in refused[0]


def test_a_server_silent_in_the_handshake_gets_reply_6_as_a_tls_timeout(run, engine_name) -> None:
    async def main() -> None:
        clock = FakeClock()
        silent = socket.create_server(("127.0.0.1", 0))  # accepts (the kernel does), never answers
        try:
            node = parse_node_link(
                f"trojan://pw@127.0.0.1:{silent.getsockname()[1]}?security=tls&sni=localhost#t", "tls"
            )
            async with honk(engine_name, (node,), fallback="tls", clock=clock) as env:
                reader, writer = await asyncio.open_connection("127.0.0.1", env.port)
                writer.write(b"\x05\x01\x00\x05\x01\x00" + encode_address("127.0.0.1", 80))
                assert await asyncio.wait_for(reader.readexactly(2), STEP) == b"\x05\x00"
                while clock.sleepers == 0:
                    await asyncio.sleep(0.001)
                await asyncio.sleep(0.05)  # the TCP connect is done and the ClientHello out
                clock.advance(2.1)
                head = await asyncio.wait_for(reader.readexactly(10), STEP)
                assert head[1] == 0x06
                await close_writer(writer)
                await asyncio.wait_for(env.inbound.wait_closed(), STEP)
                assert env.leaf("tls").runtime.dials["tls"] == 1  # the handshake's phase, not the connect's
                [error] = env.refusals
                assert isinstance(error, DialTimeout) and error.phase == "tls", error
        finally:
            silent.close()

    run(main())


def test_the_engines_handshakes_resume_the_tls13_session_a_relayed_flow_gave_back(
    run, engine_name, tmp_path
) -> None:
    ca = trustme.CA()
    ca_file = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))

    async def main() -> list[bool]:
        async with TicketingTrojanServer(ca) as server:
            node = parse_node_link(
                f"trojan://secret@127.0.0.1:{server.port}?security=tls&sni=localhost&ca={ca_file}#node", "tls"
            )
            async with honk(engine_name, (node,), fallback="tls") as env:
                for _ in range(3):
                    assert await _echo_through(env, 9, b"ping") == b"ping"
                    await asyncio.wait_for(env.inbound.wait_closed(), STEP)  # given back: its session taken
                assert env.engine_dials == [True, True, True]
            return server.reused

    assert run(main()) == [False, True, True]


# --- a second worker for the handshakes ----------------------------------------------------------


@pytest.mark.skipif(
    bool(os.environ.get("HONK_NO_EXTENSIONS")), reason="HONK_NO_EXTENSIONS: only the twin runs"
)
def test_a_second_worker_accepts_once_the_engine_dials_a_tls_handshake(run, monkeypatch) -> None:
    """Direct flows leave the inbound on one worker; the first engine dial with a TLS handshake
    (a Trojan/TLS node on a real v2ray server) makes FASTPATH_WORKERS engines accept on the same
    sockets (the kernel wakes one of them per connection, the first one unless it is busy): with
    the first one's listener stopped the second serves alone, and closing the inbound ends the
    flows of both."""
    require("compiled" in ENGINES, "the compiled relay engine (make build)")
    require((os.cpu_count() or 1) >= 2, "two CPUs (with one the fast path keeps one worker)")
    monkeypatch.setattr(fastpath, "FASTPATH_WORKERS", 2)

    async def main() -> None:
        close_engines()
        with (
            v2ray_server("trojan", transport="tcp", tls=True) as peer,
            EchoServer() as echo,
            EchoServer() as far,
        ):
            monkeypatch.setenv("SSL_CERT_FILE", str(peer.ca_path))
            node = parse_node_link(peer.share_link(), "tls")
            ispec = InboundSpec(name="lan", kind="mixed", host="127.0.0.1", port=0)
            spec = Spec(
                global_=GlobalSpec(connect_timeout=2.0),
                inbounds=(ispec,),
                nodes=(node,),
                routing=RoutingSpec(rules=(rule("dport", str(far.port), "tls"),), fallback="direct"),
            )
            async with mixed_inbound(spec, MonotonicClock()) as (inbound, _):
                env = Env(inbound, inbound._dispatcher, [], [])
                for _ in range(5):
                    assert await _echo_through(env, echo.port, b"direct") == b"direct"
                assert len(inbound._fast.paths) == 1  # no handshake yet: one worker
                assert await _echo_through(env, far.port, b"tls") == b"tls"
                paths = inbound._fast.paths
                assert len({id(path.engine) for path in paths}) == 2

                held = [await socks5_open(env.port, "127.0.0.1", echo.port) for _ in range(5)]
                paths[0].stop_accepting()
                before = sum(paths[1].engine.accepted(lid) for lid in paths[1]._lids)
                held += [await socks5_open(env.port, "127.0.0.1", echo.port) for _ in range(5)]
                assert await _echo_through(env, echo.port, b"second") == b"second"
                assert sum(paths[1].engine.accepted(lid) for lid in paths[1]._lids) == before + 6
                assert all(rep == 0 for _, _, rep, _ in held)
                assert inbound._fast.live >= len(held)
                await inbound.aclose()
                assert inbound._fast.live == 0
                for reader, writer, _, _ in held:
                    assert await asyncio.wait_for(reader.read(), STEP) == b""
                    await close_writer(writer)

    run(main())


@pytest.mark.skipif(
    bool(os.environ.get("HONK_NO_EXTENSIONS")), reason="HONK_NO_EXTENSIONS: only the twin runs"
)
def test_an_ended_tls_flow_is_freed_by_reference_counting_not_by_the_collector(run, monkeypatch) -> None:
    """A flow's FastFlow and tracker entry, and its TlsFraming with the SSLObject, point at
    nothing that points back once the flow ended: they are freed when its END is handled, not
    at a pass of the cyclic collector (whose young passes took 2.3 ms each freeing them at
    1,100 flows a second). Trojan/TLS flows through a real v2ray server."""
    require("compiled" in ENGINES, "the compiled relay engine (make build)")
    kept = {"FastFlow", "TrackedFlow", "TlsFraming", "SSLObject", "Routed"}

    async def main() -> list[str]:
        with v2ray_server("trojan", transport="tcp", tls=True) as peer, EchoServer() as echo:
            monkeypatch.setenv("SSL_CERT_FILE", str(peer.ca_path))
            node = parse_node_link(peer.share_link(), "tls")
            async with honk("native", (node,), fallback="tls") as env:
                gc.collect()
                gc.disable()
                try:
                    for _ in range(5):
                        assert await _echo_through(env, echo.port, b"ping") == b"ping"
                    await asyncio.wait_for(env.inbound.wait_closed(), STEP)
                    assert env.engine_dials == [True] * 5
                    gc.set_debug(gc.DEBUG_SAVEALL)
                    gc.collect()
                    return [type(o).__name__ for o in gc.garbage if type(o).__name__ in kept]
                finally:
                    gc.set_debug(0)
                    gc.garbage.clear()
                    gc.enable()

    assert run(main()) == []
