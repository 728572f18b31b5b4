"""SubscriptionManager's ``dial_for``: the daemon's hook for dae's ``sub()`` DNS rules. A download
without a detour asks it for a dial (one resolving the URL host through the rule's upstream) and
falls back to the ordinary dial when it gives none; a detour's download never asks it."""

from __future__ import annotations

import asyncio

from honk.config.spec import SubscriptionSpec
from honk.core.clock import FakeClock
from honk.core.net import Address
from honk.subscription.manager import SubscriptionManager

URL = "http://subs.example.test:8080/list"


class Recording:
    """A dial that records its target, then fails as an unreachable server does."""

    def __init__(self) -> None:
        self.targets: list[Address] = []
        self.dialled = asyncio.Event()

    async def __call__(self, target: Address, deadline: float):  # noqa: ANN204 - a Dial
        self.targets.append(target)
        self.dialled.set()
        raise ConnectionRefusedError("refused")


def run_once(spec: SubscriptionSpec, selected: set[str]) -> tuple[Recording, Recording, Recording, list[str]]:
    """Start a manager over ``spec`` (``selected``: the subscriptions a rule picks) and wait for
    its first download to dial; the ordinary, the detour's and the rule's dial, and the names
    ``dial_for`` was asked about."""
    ordinary, via, rule = Recording(), Recording(), Recording()
    asked: list[str] = []

    def dial_for(s: SubscriptionSpec):  # noqa: ANN202
        asked.append(s.name)
        return rule if s.name in selected else None

    async def scenario() -> None:
        m = SubscriptionManager(
            [spec],
            None,
            FakeClock(),
            ordinary,
            lambda nodes: None,
            dial_via=lambda name: via,
            dial_for=dial_for,
        )
        await m.start()
        waits = [asyncio.ensure_future(d.dialled.wait()) for d in (ordinary, via, rule)]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        await m.stop()

    asyncio.run(scenario())
    return ordinary, via, rule, asked


def test_a_download_a_sub_rule_selects_dials_with_the_rule_s_dial():
    ordinary, via, rule, _ = run_once(SubscriptionSpec("paid", URL, interval=0), {"paid"})
    assert rule.targets == [Address("subs.example.test", 8080)]
    assert ordinary.targets == [] and via.targets == []


def test_a_download_no_rule_selects_keeps_the_ordinary_dial():
    ordinary, _, rule, asked = run_once(SubscriptionSpec("free", URL, interval=0), set())
    assert ordinary.targets == [Address("subs.example.test", 8080)]
    assert rule.targets == [] and asked == ["free"]


def test_a_detoured_download_goes_through_its_detour_without_asking_the_rules():
    _, via, rule, asked = run_once(SubscriptionSpec("paid", URL, interval=0, detour="hk"), {"paid"})
    assert via.targets == [Address("subs.example.test", 8080)]
    assert rule.targets == [] and asked == []
