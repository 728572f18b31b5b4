"""Reloads through the reconciler, end to end on loopback: unchanged resources keep running
(sockets, flows, group state), changed outbounds become new versions whose old flows follow
the drain policy, and a refused reload changes nothing and releases what it bound."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket

import pytest
from helpers.apidaemon import api_block, quiet_global, running_daemon
from helpers.engines import poll
from helpers.reloading import Flow, SocksUpstream, listening_inode
from helpers.servers import EchoServer, free_port

from honk.control.desired import lower
from honk.control.errors import BindFailed, UnknownReference
from honk.control.plan import plan
from honk.core.clock import FakeClock
from honk.core.net import Network
from honk.daemon.app import Daemon

QUIET = 0.4  # seconds an expected non-event is given ("QUIET = 400 ms")


def config(
    *,
    port: int = 0,
    nodes: str = "",
    rules: str = "",
    groups: str = "",
    fallback: str = "direct",
    glob: str = "",
    inbounds: str = "",
    api: str = "",
) -> str:
    text = quiet_global().replace("}\n", glob + "}\n", 1)
    text += f"inbound {{\n    lan: 'mixed://127.0.0.1:{port}'\n{inbounds}}}\n"
    if nodes:
        text += f"node {{\n{nodes}}}\n"
    if groups:
        text += f"group {{\n{groups}}}\n"
    text += f"routing {{\n{rules}    fallback: {fallback}\n}}\n"
    return text + api


def lan_port(daemon) -> int:  # noqa: ANN001
    return daemon.inbounds["lan"].bound.port


async def reload_with(daemon, text: str, **kwargs):  # noqa: ANN001, ANN201
    daemon.config_path.write_text(text)
    return await daemon.reload(**kwargs)


async def test_open_flow_keeps_echoing_across_a_reload_that_adds_a_node_and_a_rule(tmp_path, caplog):
    caplog.set_level(logging.INFO, "honk")
    with EchoServer() as echo:
        async with SocksUpstream() as up:
            first = config(nodes=f"    proxy: '{up.link}'\n", rules=f"    dport({echo.port}) -> proxy\n")
            async with running_daemon(tmp_path, first) as daemon:
                port = lan_port(daemon)
                inode = listening_inode(port)
                listener = daemon.inbounds["lan"]
                flow = await Flow.open(port, echo.port)
                assert await flow.echoes()
                second = config(
                    nodes=f"    proxy: '{up.link}'\n    extra: 'socks5://127.0.0.1:9'\n",
                    rules=f"    dport({echo.port}) -> proxy\n    dport(9) -> extra\n",
                )
                report = await reload_with(daemon, second)
                assert report.built == ["outbound extra@v1", "route"]
                assert report.drained == report.swapped == report.rebound == report.removed == []
                assert "outbound proxy@v1" in report.reused and "inbound lan" in report.reused
                assert await flow.echoes()  # the live flow never noticed
                assert listening_inode(port) == inode != 0  # the same socket keeps listening
                assert daemon.inbounds["lan"] is listener
                assert up.connects == 1  # the unchanged node's upstream was not redialled
                assert (
                    "config reloaded: built [outbound extra@v1, route]; reused [dns, outbound direct@v1"
                    in caplog.text
                )
                second_flow = await Flow.open(port, echo.port)  # new flows use the new plane
                assert await second_flow.echoes()
                await flow.close()
                await second_flow.close()


async def test_unchanged_reapply_reuses_everything_and_keeps_the_epoch(tmp_path, caplog):
    caplog.set_level(logging.INFO, "honk")
    text = config(nodes="    proxy: 'socks5://127.0.0.1:9'\n")
    async with running_daemon(tmp_path, text) as daemon:
        epoch = daemon.epoch
        assert epoch == 1  # the first plan builds DNS, so it publishes
        report = await reload_with(daemon, text)
        assert report.built == [] and report.epoch == epoch == daemon.epoch
        assert report.reused == [
            "dns",
            "outbound direct@v1",
            "outbound block@v1",
            "outbound proxy@v1",
            "route",
            "inbound lan",
        ]
        assert "config reloaded: reused [dns, outbound direct@v1, outbound block@v1" in caplog.text


@pytest.mark.parametrize("drain", ["keep", "close"])
async def test_a_changed_node_address_keeps_or_ends_the_old_flow_by_drain_policy(tmp_path, caplog, drain):
    caplog.set_level(logging.DEBUG, "honk")
    with EchoServer() as echo:
        async with SocksUpstream() as first_up, SocksUpstream() as second_up:

            def text(up: SocksUpstream) -> str:
                return config(
                    nodes=f"    proxy: '{up.link}'\n",
                    rules=f"    dport({echo.port}) -> proxy\n",
                    glob=f"    drain: {drain}\n",
                )

            async with running_daemon(tmp_path, text(first_up)) as daemon:
                port = lan_port(daemon)
                old = await Flow.open(port, echo.port)
                assert await old.echoes()
                assert [c.outbound_version for c in daemon.tracker.snapshot()] == ["proxy@v1"]
                report = await reload_with(daemon, text(second_up))
                assert report.built == ["outbound proxy@v2"] and report.drained == ["proxy@v1"]
                new = await Flow.open(port, echo.port)
                assert await new.echoes()
                assert second_up.connects == 1
                if drain == "keep":
                    assert await old.echoes()  # a TCP flow cannot move: it stays on v1
                    versions = sorted(c.outbound_version for c in daemon.tracker.snapshot())
                    assert versions == ["proxy@v1", "proxy@v2"]
                else:
                    assert await old.ended()
                    await poll(
                        lambda: "the outbound this flow was opened on was drained" in caplog.text,
                        "the drained flow's end to be logged",
                    )
                    assert await new.echoes()  # only the named version was drained
                await old.close()
                await new.close()


async def test_close_after_ends_old_flows_when_the_grace_passes_on_the_injected_clock(tmp_path):
    clock = FakeClock()
    with EchoServer() as echo:
        async with SocksUpstream() as first_up, SocksUpstream() as second_up:

            def text(up: SocksUpstream) -> str:
                return config(
                    nodes=f"    proxy: '{up.link}?drain=5s'\n", rules=f"    dport({echo.port}) -> proxy\n"
                )

            async with running_daemon(tmp_path, text(first_up), clock=clock) as daemon:
                flow = await Flow.open(lan_port(daemon), echo.port)
                assert await flow.echoes()
                await reload_with(daemon, text(second_up))
                clock.advance(4.9)
                assert await flow.echoes()
                clock.advance(0.1)
                assert await flow.ended()


async def test_shutdown_does_not_wait_for_pending_grace_timers(tmp_path):
    clock = FakeClock()
    with EchoServer() as echo:
        async with SocksUpstream() as first_up, SocksUpstream() as second_up:

            def text(up: SocksUpstream) -> str:
                return config(
                    nodes=f"    proxy: '{up.link}'\n",
                    rules=f"    dport({echo.port}) -> proxy\n",
                    glob="    drain: 1h\n    user_removal: 1h\n",
                )

            cfg = tmp_path / "honk.dae"
            cfg.write_text(text(first_up))
            daemon = Daemon(cfg, clock=clock)
            await daemon.start()
            flow = await Flow.open(lan_port(daemon), echo.port)
            await reload_with(daemon, text(second_up))
            assert daemon.drainer.pending == 1  # a one-hour timer is armed
            await asyncio.wait_for(daemon.shutdown(0.0), 5.0)  # returns within SOON
            assert daemon.drainer.pending == 0
            await flow.close()


async def test_a_reload_that_fails_to_bind_changes_nothing_and_releases_what_it_bound(tmp_path, caplog):
    caplog.set_level(logging.INFO, "honk")
    free = free_port()
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    taken = held.getsockname()[1]
    try:
        text = config(nodes="    proxy: 'socks5://127.0.0.1:9'\n")
        async with running_daemon(tmp_path, text) as daemon:
            epoch, plane = daemon.epoch, daemon.plane
            refused = config(
                nodes="    proxy: 'socks5://127.0.0.1:19'\n",
                rules="    dport(9) -> proxy\n",
                inbounds=f"    extra1: 'mixed://127.0.0.1:{free}'\n    extra2: 'mixed://127.0.0.1:{taken}'\n",
            )
            with pytest.raises(BindFailed) as caught:
                await reload_with(daemon, refused)
            assert str(caught.value).startswith(f"inbound extra2: binding 127.0.0.1:{taken} failed: ")
            assert f"reload: inbound extra2: binding 127.0.0.1:{taken} failed" in caplog.text
            assert "; keeping the running config" in caplog.text
            assert daemon.epoch == epoch and daemon.plane is plane  # nothing was published
            assert set(daemon.inbounds) == {"lan"}
            probe = socket.socket()
            probe.bind(("127.0.0.1", free))  # the socket bound in prepare was released
            probe.close()
            # a plan refused at validation reaches nothing either
            daemon.config_path.write_text(text)
            bad = lower(daemon.spec)
            bad = dataclasses.replace(
                bad,
                route=dataclasses.replace(
                    bad.route, routing=dataclasses.replace(bad.route.routing, fallback="nope")
                ),
            )
            with pytest.raises(UnknownReference, match="^route references unknown outbound nope$"):
                plan(daemon.applier.running, bad)
    finally:
        held.close()


async def test_a_moved_inbound_keeps_its_sessions_and_the_old_port_stops_accepting(tmp_path):
    first_port, second_port = free_port(), free_port()
    with EchoServer() as echo:
        async with running_daemon(tmp_path, config(port=first_port)) as daemon:
            flow = await Flow.open(first_port, echo.port)
            assert await flow.echoes()
            report = await reload_with(daemon, config(port=second_port))
            assert report.rebound == ["lan"] and report.removed == []
            assert await flow.echoes()
            assert listening_inode(first_port) == 0
            with pytest.raises(OSError):
                await asyncio.open_connection("127.0.0.1", first_port)
            moved = await Flow.open(second_port, echo.port)
            assert await moved.echoes()
            await flow.close()
            await moved.close()


async def test_renamed_and_removed_inbounds_close_their_sessions(tmp_path):
    a_port, b_port = free_port(), free_port()
    with EchoServer() as echo:
        both = config(inbounds=f"    a: 'mixed://127.0.0.1:{a_port}'\n    b: 'mixed://127.0.0.1:{b_port}'\n")
        async with running_daemon(tmp_path, both) as daemon:
            on_a, on_b = await Flow.open(a_port, echo.port), await Flow.open(b_port, echo.port)
            assert await on_a.echoes() and await on_b.echoes()
            inode = listening_inode(a_port)
            renamed = config(
                inbounds=f"    a2: 'mixed://127.0.0.1:{a_port}'\n    b: 'mixed://127.0.0.1:{b_port}'\n"
            )
            report = await reload_with(daemon, renamed)
            assert report.swapped == ["a2"] and report.removed == ["a"]
            assert await on_a.ended()
            assert await on_b.echoes()
            assert listening_inode(a_port) == inode  # the port still accepts, on the same socket
            again = await Flow.open(a_port, echo.port)
            assert await again.echoes()
            report = await reload_with(daemon, config(inbounds=f"    a2: 'mixed://127.0.0.1:{a_port}'\n"))
            assert report.removed == ["b"]
            assert await on_b.ended()
            assert listening_inode(b_port) == 0
            await again.close()


async def test_a_user_whose_credential_changed_loses_their_session_and_old_password(tmp_path):
    port = free_port()
    plain = config(port=port)

    def with_users(users: str) -> str:
        return plain.replace(f"mixed://127.0.0.1:{port}", f"mixed://{users}@127.0.0.1:{port}")

    with EchoServer() as echo:
        async with running_daemon(tmp_path, with_users("alice:pa")) as daemon:
            inode = listening_inode(port)
            alice = await Flow.open(port, echo.port, auth=("alice", "pa"))
            assert await alice.echoes()
            report = await reload_with(daemon, with_users("alice:changed"))
            assert report.built == ["user set lan"] and "inbound lan" in report.reused
            assert await alice.ended()  # the old principal was revoked under the default, close
            with pytest.raises(AssertionError, match="0xff"):
                await Flow.open(port, echo.port, auth=("alice", "pa"))
            fresh = await Flow.open(port, echo.port, auth=("alice", "changed"))
            assert await fresh.echoes()
            assert listening_inode(port) == inode
            await fresh.close()


async def test_selector_choice_survives_and_urltest_state_is_kept_while_its_members_are(tmp_path):
    groups = (
        "    sel {\n        filter: name(a, b)\n    }\n"
        "    auto {\n        filter: name(a, b)\n        policy: min_moving_avg\n    }\n"
    )
    nodes = "    a: 'socks5://127.0.0.1:9'\n    b: 'socks5://127.0.0.1:19'\n"
    async with running_daemon(tmp_path, config(nodes=nodes, groups=groups, fallback="sel")) as daemon:
        await daemon.select("sel", "b")
        auto_policy = daemon.plane.groups.policy("auto")
        uid = daemon.plane.groups.identity_of("sel").uid
        report = await reload_with(
            daemon, config(nodes=nodes + "    c: 'socks5://127.0.0.1:29'\n", groups=groups, fallback="sel")
        )
        assert "group auto" in report.reused and "group sel" in report.reused
        assert daemon.plane.groups.policy("auto") is auto_policy  # winner and all state kept
        assert daemon.plane.groups.choices()["sel"][Network.TCP] == "b"
        assert daemon.plane.groups.identity_of("sel").uid == uid
        # a member rebuilt rebuilds the group, but the choice and the identity survive
        report = await reload_with(
            daemon, config(nodes=nodes.replace(":19", ":39"), groups=groups, fallback="sel")
        )
        assert "group sel" in report.built and "group auto" in report.built
        assert daemon.plane.groups.policy("auto") is not auto_policy
        assert daemon.plane.groups.identity_of("sel").uid == uid
        # a renamed group is a new group
        renamed = groups.replace("    sel {", "    picker {")
        await reload_with(daemon, config(nodes=nodes, groups=renamed, fallback="picker"))
        assert daemon.plane.groups.identity_of("picker").uid != uid


async def test_commands_are_serialized_and_a_departed_caller_still_gets_its_apply(tmp_path):
    nodes = "    a: 'socks5://127.0.0.1:9'\n    b: 'socks5://127.0.0.1:19'\n"
    groups = "    sel {\n        filter: name(a, b)\n    }\n"
    async with running_daemon(tmp_path, config(nodes=nodes, groups=groups, fallback="sel")) as daemon:
        overlaps = []
        commit = daemon.applier.commit

        async def watched(prepared):  # noqa: ANN001, ANN202
            overlaps.append(daemon.reconciler.running)
            await asyncio.sleep(0.01)
            return await commit(prepared)

        daemon.applier.commit = watched
        daemon.config_path.write_text(
            config(nodes=nodes + "    c: 'socks5://127.0.0.1:29'\n", groups=groups, fallback="sel")
        )
        leaving = asyncio.ensure_future(daemon.reload())
        writes = [asyncio.ensure_future(daemon.select("sel", m)) for m in ("b", "a")]
        await asyncio.sleep(0)
        leaving.cancel()  # the caller goes away after queueing
        await asyncio.gather(*writes)
        assert daemon.plane.groups.choices()["sel"][Network.TCP] == "a"  # applied after the reload, in order
        assert "c" in daemon.plane.outbounds  # the departed caller's reload was applied
        assert overlaps == ["reload"]


async def test_the_api_returns_the_report_and_refuses_a_bad_file_with_its_text(tmp_path):
    import aiohttp

    text = config(nodes="    proxy: 'socks5://127.0.0.1:9'\n", api=api_block("s3cret"))
    async with running_daemon(tmp_path, text) as daemon:
        host, port = daemon.api.bound
        base = f"http://{host}:{port}"
        headers = {"Authorization": "Bearer s3cret"}
        async with aiohttp.ClientSession(headers=headers) as http:
            daemon.config_path.write_text(text.replace("127.0.0.1:9'", "127.0.0.1:19'"))
            async with http.post(f"{base}/v1/reload") as resp:
                assert resp.status == 200
                body = await resp.json()
            assert body["built"] == ["outbound proxy@v2"] and body["drained"] == ["proxy@v1"]
            assert body["summary"].startswith("built [outbound proxy@v2]; drained [proxy@v1]; reused [dns")
            daemon.config_path.write_text(text.replace("fallback: direct", "fallback: nope"))
            async with http.put(f"{base}/configs?force=true", json={"path": "", "payload": ""}) as resp:
                assert resp.status == 400
                assert "fallback" in (await resp.json())["message"]
            daemon.config_path.write_text(text)
            async with http.put(f"{base}/configs?force=true", json={}) as resp:
                assert resp.status == 204
            assert daemon.api.bound == (host, port)  # the API listener itself was reused
