"""Groups in the running daemon: Selector writes serialized with reloads, choices persisted and
restored, callbacks installed before a manager is published, group identity across reloads."""

from __future__ import annotations

import asyncio

from helpers.apidaemon import LAN_INBOUND, quiet_global
from helpers.engines import poll

from honk.core.net import Network
from honk.daemon.app import Daemon

ROUTED = """node {{
    a: 'socks5://127.0.0.1:9'
    b: 'socks5://127.0.0.1:19'
{extra}}}
group {{
    proxy {{
        filter: name(a, b{extra_member})
    }}
{groups}}}
routing {{
    fallback: proxy
}}
"""


def write(path, extra: str = "", extra_member: str = "", groups: str = "") -> None:
    routed = ROUTED.format(extra=extra, extra_member=extra_member, groups=groups)
    path.write_text(quiet_global() + LAN_INBOUND + routed)


async def test_a_write_during_a_reload_lands_in_the_published_manager(tmp_path):
    cfg = tmp_path / "honk.dae"
    write(cfg)
    daemon = Daemon(cfg)
    await daemon.start()
    try:
        old = daemon.plane.groups
        gate = asyncio.Event()
        publish = daemon.health.apply

        async def held_apply(plane):  # the reload holds the control lock here
            await gate.wait()
            await publish(plane)

        daemon.health.apply = held_apply
        write(cfg, extra="    c: 'socks5://127.0.0.1:29'\n", extra_member=", c")
        reload = asyncio.ensure_future(daemon.reload())
        await poll(lambda: daemon.plane.groups is not old, "the replacement to be built")
        write_task = asyncio.ensure_future(daemon.select("proxy", "c"))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not write_task.done()  # it waits for the reload
        gate.set()
        assert await reload
        assert await write_task == [Network.TCP, Network.UDP]
        assert daemon.plane.groups.choices() == {"proxy": {Network.TCP: "c", Network.UDP: "c"}}
        assert daemon.groups.current is daemon.plane.groups
        assert old.choices() == {}  # never acknowledged against the replaced manager
    finally:
        await daemon.shutdown(0.0)


async def test_choices_are_persisted_per_network_and_restored_at_startup(tmp_path):
    cfg = tmp_path / "honk.dae"
    write(cfg)
    daemon = Daemon(cfg)
    await daemon.start()
    try:
        await daemon.select("proxy", "b", Network.UDP)
        assert daemon.plane.groups.sink is not None  # installed before publication
    finally:
        await daemon.shutdown(0.0)
    again = Daemon(cfg)
    await again.start()
    try:
        assert again.plane.groups.choices() == {"proxy": {Network.UDP: "b"}}
        assert again.plane.groups.resolve("proxy", Network.UDP).leaf.name == "b"
        assert again.plane.groups.resolve("proxy", Network.TCP).leaf.name == "a"
    finally:
        await again.shutdown(0.0)


async def test_a_reload_keeps_group_identity_by_name_and_installs_callbacks_first(tmp_path):
    cfg = tmp_path / "honk.dae"
    write(cfg, groups="    other {\n        filter: name(a)\n    }\n")
    daemon = Daemon(cfg)
    await daemon.start()
    try:
        before = daemon.plane.groups.identity_of("proxy")
        other = daemon.plane.groups.identity_of("other")
        write(cfg, groups="    renamed {\n        filter: name(a)\n    }\n")
        assert await daemon.reload()
        groups = daemon.plane.groups
        assert groups.identity_of("proxy") == before
        assert groups.identity_of("renamed").uid != other.uid
        assert groups.sink is not None
    finally:
        await daemon.shutdown(0.0)


async def test_an_activation_drops_automatic_group_pins_and_keeps_selector_choices(tmp_path):
    """GH-A-16 with GH-A-03 through the daemon's reload: the groups are unchanged (reused with
    their state), yet the URLTest's and the Fallback's native pins are gone from the published
    manager, while the Selector's choice is still served."""
    automatic = (
        "    auto {\n        filter: name(a, b)\n        policy: min_moving_avg\n    }\n"
        "    fb {\n        filter: name(a, b)\n        policy: fallback\n    }\n"
    )
    cfg = tmp_path / "honk.dae"
    write(cfg, groups=automatic)
    daemon = Daemon(cfg)
    await daemon.start()
    try:
        assert await daemon.select("proxy", "b", Network.TCP) == [Network.TCP]
        assert await daemon.pin("auto", "b") == [Network.TCP, Network.UDP]
        assert await daemon.pin("fb", "b", Network.UDP) == [Network.UDP]
        groups = daemon.plane.groups
        assert groups.resolve("auto", Network.TCP).leaf.name == "b"
        assert groups.resolve("fb", Network.UDP).leaf.name == "b"
        write(cfg, extra="    c: 'socks5://127.0.0.1:29'\n", groups=automatic)  # a node no group selects
        report = await daemon.reload()
        assert {"group auto", "group fb", "group proxy"} <= set(report.reused)
        groups = daemon.plane.groups
        assert groups.pinned("auto") == {} and groups.pinned("fb") == {}
        assert groups.resolve("auto", Network.TCP).leaf.name == "a"
        assert groups.resolve("fb", Network.UDP).leaf.name == "a"
        assert groups.choices() == {"proxy": {Network.TCP: "b"}}
        assert groups.resolve("proxy", Network.TCP).leaf.name == "b"
    finally:
        await daemon.shutdown(0.0)


async def test_interrupt_connections_closes_exactly_the_flows_of_the_changed_group_and_network(tmp_path):
    """L suggested test 3: F1 and F2 (TCP via g) close; F3 (TCP via h, same leaf) and F4 (UDP via
    g) stay; the write returns only once F1 and F2 have ended."""
    import socket

    from helpers.aio import close_writer, socks5_open
    from helpers.servers import EchoServer
    from helpers.socks import encode_address

    with EchoServer() as a, EchoServer() as b:
        cfg = tmp_path / "honk.dae"
        cfg.write_text(
            quiet_global() + LAN_INBOUND + "node {\n    x: 'socks5://127.0.0.1:9'\n}\n"
            "group {\n"
            "    g {\n        filter: name(direct, x)\n        interrupt_connections: true\n    }\n"
            "    h {\n        filter: name(direct)\n        interrupt_connections: true\n    }\n"
            "}\n"
            f"routing {{\n    dport({b.port}) -> h\n    fallback: g\n}}\n"
        )
        daemon = Daemon(cfg)
        await daemon.start()
        port = daemon.inbounds["lan"].bound.port
        opened = []
        try:
            await daemon.select("g", "direct")  # members are nodes first: x, then direct
            for target in (a.port, a.port, b.port):
                reader, writer, code, _ = await socks5_open(port, "127.0.0.1", target)
                assert code == 0
                opened.append((reader, writer))
            _, control, code, tail = await socks5_open(port, "0.0.0.0", 0, cmd=3)
            assert code == 0
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            udp.sendto(
                b"\x00\x00\x00" + encode_address("127.0.0.1", a.port) + b"hi",
                ("127.0.0.1", int.from_bytes(tail[4:6], "big")),
            )
            await poll(
                lambda: (
                    len(daemon.tracker.snapshot()) == 4 and all(c.chain for c in daemon.tracker.snapshot())
                ),
                "four routed flows",
            )
            by_chain = {(c.network, c.chain) for c in daemon.tracker.snapshot()}
            assert (Network.UDP, ("g", "direct")) in by_chain and (Network.TCP, ("h", "direct")) in by_chain
            assert await daemon.select("g", "x", Network.TCP) == [Network.TCP]
            left = daemon.tracker.snapshot()  # the write returned after the closes completed
            assert sorted((c.network.value, c.chain) for c in left) == [
                ("tcp", ("h", "direct")),
                ("udp", ("g", "direct")),
            ]
            for reader, _ in opened[:2]:
                assert await asyncio.wait_for(reader.read(), 5) == b""
            assert await daemon.select("g", "x", Network.TCP) == []  # re-selecting reconnects nothing
            udp.close()
            await close_writer(control)
        finally:
            for _, writer in opened:
                writer.close()
            await daemon.shutdown(0.0)
