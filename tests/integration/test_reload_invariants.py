"""The reconciler's invariants under faults and edge cases: a prepare that fails at any step
changes nothing, only the version a step names is drained, a route change reaches the next
UDP datagram but no established TCP flow, and removed users lose their sessions (only theirs)."""

from __future__ import annotations

import asyncio
import logging
import socket

import pytest
from helpers.aio import socks5_open
from helpers.apidaemon import api_block, running_daemon
from helpers.engines import poll
from helpers.reloading import Flow, listening_inode
from helpers.servers import EchoServer, free_port
from helpers.socks import UDP_HEADER_PREFIX, encode_address

from honk.config.policies import CLOSE
from honk.config.spec import InboundUser
from honk.control import apply as apply_module
from honk.control.desired import lower
from honk.control.errors import ApplyError, BindFailed, BuildFailed, Invalid
from honk.control.plan import Drain, OutboundId, Plan, plan
from honk.route import router as router_module

QUIET = 0.4  # seconds in which an expected non-event must not happen ("QUIET = 400 ms")
GLOBAL = "global {\n    data_dir: ./var\n    tcp_check_url: ''\n    check_interval: 3600s\n{extra}}\n"


def config(
    *, port: int = 0, users: str = "", nodes: str = "", rules: str = "", glob: str = "", inbounds: str = ""
) -> str:
    creds = f"{users}@" if users else ""
    text = GLOBAL.replace("{extra}", glob)
    text += f"inbound {{\n    lan: 'mixed://{creds}127.0.0.1:{port}'\n{inbounds}}}\n"
    if nodes:
        text += f"node {{\n{nodes}}}\n"
    return text + f"routing {{\n{rules}    fallback: direct\n}}\n"


def running_snapshot(daemon):  # noqa: ANN001, ANN201
    a = daemon.applier
    return (
        a.running,
        a.plane,
        a.epoch,
        dict(a.targets),
        dict(a.listeners),
        dict(a.admissions),
        daemon.dispatcher._plane,
    )


class _Boom(Exception):
    pass


def _failing(*_args, **_kwargs):  # noqa: ANN002, ANN003, ANN202
    raise _Boom("injected")


@pytest.mark.parametrize("where", ["dns", "outbound", "group", "route", "bind"])
async def test_a_prepare_that_fails_at_any_step_changes_nothing(tmp_path, monkeypatch, where):
    held = socket.create_server(("127.0.0.1", 0))
    try:
        nodes = "    a: 'socks5://127.0.0.1:9'\n"
        first = config(nodes=nodes)
        async with running_daemon(tmp_path, first) as daemon:
            lan = daemon.inbounds["lan"]
            before = running_snapshot(daemon)
            changed = config(
                nodes=nodes + "    b: 'socks5://127.0.0.1:19'\n",
                rules="    dport(19) -> b\n",
                glob="    connect_timeout: 2500ms\n" if where == "dns" else "",
            )
            if where == "bind":
                changed = changed.replace(
                    "    lan: 'mixed://127.0.0.1:0'\n",
                    "    lan: 'mixed://127.0.0.1:0'\n"
                    f"    extra: 'mixed://127.0.0.1:{held.getsockname()[1]}'\n",
                )
            elif where == "dns":
                monkeypatch.setattr(apply_module, "SystemResolver", _failing)
            elif where == "outbound":
                monkeypatch.setattr(apply_module, "build_leaf", _failing)
            elif where == "group":
                monkeypatch.setattr(apply_module.GroupManager, "build", _failing)
            else:
                monkeypatch.setattr(router_module.Router, "compile", _failing)
            daemon.config_path.write_text(changed)
            with pytest.raises(BindFailed if where == "bind" else BuildFailed):
                await daemon.reload()
            assert running_snapshot(daemon) == before
            assert daemon.inbounds["lan"] is lan
            monkeypatch.undo()
            held.close()
            report = await daemon.reload()  # the same change applies once nothing fails
            assert "outbound b@v1" in report.built
    finally:
        held.close()


async def test_only_the_version_a_drain_step_names_is_drained(tmp_path):
    async with running_daemon(tmp_path, config(nodes="    a: 'socks5://127.0.0.1:9'\n")) as daemon:
        drained: list[str] = []
        daemon.drainer.drain = lambda version, policy: drained.append(version)
        desired = lower(daemon.spec)
        steps = plan(daemon.applier.running, desired)
        forged = Plan([*steps.steps, Drain(OutboundId("a", 7), CLOSE)], steps.versions)
        prepared = await daemon.applier.prepare(forged, desired)
        report = await daemon.applier.commit(prepared)
        assert report.drained == ["a@v7"]  # reported as the step says
        assert drained == []  # but a@v1 runs, and v7 is not it: nothing was closed


class UdpEcho:
    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.sock.setblocking(False)
        loop.add_reader(self.sock.fileno(), self._echo)

    def _echo(self) -> None:
        try:
            data, peer = self.sock.recvfrom(65535)
        except BlockingIOError:
            return
        self.sock.sendto(data, peer)

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.sock.fileno())
        self.sock.close()


async def test_a_route_change_reaches_the_next_udp_datagram_but_not_an_established_tcp_flow(tmp_path):
    with EchoServer() as echo:
        udp_echo = UdpEcho()
        udp_echo.start()
        try:
            async with running_daemon(tmp_path, config()) as daemon:
                port = daemon.inbounds["lan"].bound.port
                tcp = await Flow.open(port, echo.port)
                assert await tcp.echoes()
                client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                client.bind(("127.0.0.1", 0))
                client.setblocking(False)
                reader, writer, code, bound = await socks5_open(port, *client.getsockname(), cmd=3)
                assert code == 0
                relay = ("127.0.0.1", int.from_bytes(bound[-2:], "big"))
                loop = asyncio.get_running_loop()

                async def exchange(payload: bytes) -> bytes | None:
                    await loop.sock_sendto(
                        client,
                        UDP_HEADER_PREFIX + encode_address("127.0.0.1", udp_echo.port) + payload,
                        relay,
                    )
                    try:
                        return await asyncio.wait_for(loop.sock_recv(client, 65535), QUIET)
                    except TimeoutError:
                        return None

                assert (await exchange(b"one")).endswith(b"one")
                epoch = daemon.epoch
                daemon.config_path.write_text(
                    config(rules=f"    dport({udp_echo.port}) -> block\n    dport({echo.port}) -> block\n")
                )
                await daemon.reload()
                assert daemon.epoch == epoch + 1
                assert await tcp.echoes()  # established: untouched
                assert await exchange(b"two") is None  # the next datagram follows the new plane
                refused = await socks5_open(port, "127.0.0.1", echo.port)
                assert refused[2] == 0x02  # a new TCP flow is refused by the new rule
                writer.close()
                refused[1].close()
                client.close()
                await tcp.close()
        finally:
            udp_echo.close()


@pytest.mark.parametrize("policy", ["close", "keep"])
async def test_removing_a_user_closes_only_their_sessions(tmp_path, policy):
    port, other_port = free_port(), free_port()
    glob = f"    user_removal: {policy}\n"
    other = f"    other: 'mixed://alice:pa@127.0.0.1:{other_port}'\n"  # alice again: another principal
    with EchoServer() as echo:
        async with running_daemon(
            tmp_path, config(port=port, users="alice:pa", glob=glob, inbounds=other)
        ) as daemon:
            alice = await Flow.open(port, echo.port, auth=("alice", "pa"))
            alice_elsewhere = await Flow.open(other_port, echo.port, auth=("alice", "pa"))
            inode = listening_inode(port)
            daemon.config_path.write_text(config(port=port, users="bob:pb", glob=glob, inbounds=other))
            report = await daemon.reload()
            assert report.built == ["user set lan"] and report.reused[-2:] == ["inbound lan", "inbound other"]
            if policy == "close":
                assert await alice.ended()
            else:
                assert await alice.echoes()  # keep spares a session that was already bound
            assert await alice_elsewhere.echoes()  # her principal on the other inbound was not revoked
            with pytest.raises(AssertionError, match="0xff"):
                await Flow.open(port, echo.port, auth=("alice", "pa"))  # no longer admitted here
            bob = await Flow.open(port, echo.port, auth=("bob", "pb"))
            assert await bob.echoes()
            assert listening_inode(port) == inode
            for flow in (bob, alice, alice_elsewhere):
                await flow.close()


@pytest.mark.parametrize("policy", ["keep", "close", "10s"])
async def test_a_principal_revoked_before_its_first_flow_is_refused_under_every_policy(
    tmp_path, caplog, policy
):
    caplog.set_level(logging.INFO, "honk")
    port = free_port()
    glob = f"    user_removal: {policy}\n"
    with EchoServer() as echo:
        async with running_daemon(tmp_path, config(port=port, users="alice:pa", glob=glob)) as daemon:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"\x05\x01\x02")
            assert await reader.readexactly(2) == b"\x05\x02"
            writer.write(b"\x01\x05alice\x02pa")
            assert await reader.readexactly(2) == b"\x01\x00"  # authenticated, no CONNECT yet
            daemon.config_path.write_text(config(port=port, users="bob:pb", glob=glob))
            await daemon.reload()
            writer.write(b"\x05\x01\x00" + encode_address("127.0.0.1", echo.port))
            head = await asyncio.wait_for(reader.read(4), 5)
            assert head[:2] == b"\x05\x02" or head == b""  # refused: not allowed
            await poll(
                lambda: "the user was removed before the session opened a flow" in caplog.text,
                "the refusal to be logged",
            )
            writer.close()


async def test_a_refused_apply_reports_its_error_text_and_variant(tmp_path):
    async with running_daemon(tmp_path, config()) as daemon:
        daemon.config_path.write_text(config().replace("fallback: direct", "fallback: nowhere"))
        with pytest.raises(ApplyError) as caught:
            await daemon.reload()
        assert caught.value.variant == "config" and "routing.fallback" in str(caught.value)
        assert daemon.stats.reloads[("refused", "config")] == 1


async def test_user_edits_change_one_user_set_without_planning(tmp_path):
    port = free_port()
    with EchoServer() as echo:
        async with running_daemon(tmp_path, config(port=port, users="alice:pa")) as daemon:
            epoch, plane, inode = daemon.epoch, daemon.plane.router, listening_inode(port)
            alice = await Flow.open(port, echo.port, auth=("alice", "pa"))
            assert await daemon.remove_user("lan", "carol") is False  # not there: nothing changes
            await daemon.upsert_user("lan", InboundUser("bob", "pb"))
            bob = await Flow.open(port, echo.port, auth=("bob", "pb"))
            assert await alice.echoes()  # an upsert of another user leaves alice's principal alone
            assert await daemon.remove_user("lan", "alice") is True
            assert await alice.ended()  # user_removal defaults to close
            assert await bob.echoes()
            with pytest.raises(AssertionError, match="0xff"):
                await Flow.open(port, echo.port, auth=("alice", "pa"))
            with pytest.raises(Invalid, match="^user set nosuch: no such user set$"):
                await daemon.set_users("nosuch", [InboundUser("x", "y")])
            await daemon.set_users("lan", [InboundUser("bob", "pb"), InboundUser("dora", "pd")])
            assert await bob.echoes()  # same password: the same principal, the session stays
            assert daemon.epoch == epoch and daemon.plane.router is plane  # no plan, no publish
            assert listening_inode(port) == inode
            assert [u.username for u in daemon.spec.inbounds[0].users] == ["bob", "dora"]
            await bob.close()


async def test_the_native_api_edits_users_and_names_an_unknown_set(tmp_path):
    import aiohttp

    port = free_port()
    text = config(port=port, users="alice:pa") + api_block("s3")
    with EchoServer() as echo:
        async with running_daemon(tmp_path, text) as daemon:
            host, api_port = daemon.api.bound
            base = f"http://{host}:{api_port}/v1/users"
            async with aiohttp.ClientSession(headers={"Authorization": "Bearer s3"}) as http:
                async with http.put(f"{base}/lan/bob", json={"password": "pb"}) as resp:
                    assert resp.status == 200
                bob = await Flow.open(port, echo.port, auth=("bob", "pb"))
                async with http.delete(f"{base}/lan/carol") as resp:
                    assert (resp.status, (await resp.json())["removed"]) == (200, False)
                async with http.delete(f"{base}/lan/bob") as resp:
                    assert (resp.status, (await resp.json())["removed"]) == (200, True)
                assert await bob.ended()
                async with http.put(
                    f"{base}/nosuch", json={"users": [{"username": "x", "password": "y"}]}
                ) as resp:
                    assert resp.status == 400
                    assert (await resp.json())["error"]["message"] == "user set nosuch: no such user set"
                async with http.put(f"{base}/lan", json={"users": "alice"}) as resp:
                    assert resp.status == 400


async def test_closing_flows_waits_for_an_apply_in_progress(tmp_path):
    with EchoServer() as echo:
        async with running_daemon(tmp_path, config()) as daemon:
            flow = await Flow.open(daemon.inbounds["lan"].bound.port, echo.port)
            gate, entered = asyncio.Event(), asyncio.Event()
            commit = daemon.applier.commit

            async def held(prepared):  # noqa: ANN001, ANN202
                entered.set()
                await gate.wait()
                return await commit(prepared)

            daemon.applier.commit = held
            daemon.config_path.write_text(config(rules="    dport(9) -> block\n"))
            reload = asyncio.ensure_future(daemon.reload())
            await asyncio.wait_for(entered.wait(), 5)
            closing = asyncio.ensure_future(daemon.close_flows(None, "closed by the test"))
            for _ in range(20):
                await asyncio.sleep(0)
            assert not closing.done() and await flow.echoes()  # queued behind the apply
            gate.set()
            await reload
            assert len(await closing) == 1
            assert await flow.ended()
