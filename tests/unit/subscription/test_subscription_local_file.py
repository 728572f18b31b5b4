"""dae's ``file://`` subscriptions (a node list on disk, relative to the configuration) and
``https-file://`` (the same URL over https): read as dae reads them, refreshed like downloads."""

from __future__ import annotations

import asyncio
from pathlib import Path

from honk.config.load import load_text
from honk.config.spec import SubscriptionSpec
from honk.core.clock import FakeClock
from honk.subscription.manager import SubscriptionManager

NODES = b"socks5://192.0.2.1:1080#local-a\nsocks5://192.0.2.2:1080#local-b\n"


def test_a_relative_file_url_resolves_against_the_configuration_and_names_a_tagless_entry(tmp_path: Path):
    text = (
        "subscription {\n    mine: 'file://subs/nodes.sub'\n    'file:///srv/other.sub'\n"
        "    'https-file://example.com/link?token=1'\n}\n"
    )
    spec = load_text(text, "dae", base_dir=str(tmp_path))
    assert [(s.name, s.url) for s in spec.subscriptions] == [
        ("mine", f"file://{tmp_path / 'subs' / 'nodes.sub'}"),
        ("other.sub", "file:///srv/other.sub"),
        ("example.com", "https://example.com/link?token=1"),
    ]


def test_the_manager_reads_a_local_list_and_keeps_its_nodes_when_the_file_goes(tmp_path: Path):
    path = tmp_path / "nodes.sub"
    path.write_bytes(NODES)
    spec = SubscriptionSpec("mine", f"file://{path}", interval=60.0)

    async def never_dial(target, deadline):  # noqa: ANN001, ANN202 - a local list dials nothing
        raise AssertionError(f"a file:// subscription dialled {target}")

    async def scenario() -> None:
        clock, published = FakeClock(), []
        m = SubscriptionManager([spec], None, clock, never_dial, published.append)
        await m.start()
        await _until(lambda: m.states()[0].attempts == 1 and clock.sleepers == 1)
        assert [n.name for n in published[-1]["mine"]] == ["local-a", "local-b"]
        path.unlink()
        clock.advance(60.0)
        await _until(lambda: m.states()[0].attempts == 2 and clock.sleepers == 1)
        assert m.states()[0].last_error == "file-unreadable"
        assert [n.name for n in m.nodes()["mine"]] == ["local-a", "local-b"]  # kept
        await m.stop()

    asyncio.run(scenario())


async def _until(condition, bound: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + bound
    while not condition():
        assert loop.time() < end, "condition did not hold in time"
        await asyncio.sleep(0.005)
