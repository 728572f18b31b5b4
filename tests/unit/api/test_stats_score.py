"""``/stats.score`` (GH-K-130), Score's ``/metrics`` series and its Clash representation
(GH-K-132), through a real aiohttp client against a running daemon's API surfaces.

The tests serve the API from a control whose plane is the daemon's own with its groups rebuilt
(a fresh ScoreState the test alone ranks with), so that no flow of the daemon's own moves the
counters the tests compare.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
from typing import Any

import pytest
from aiohttp import test_utils
from helpers.apidaemon import LAN_INBOUND, bearer, metric_samples, quiet_global, running_daemon

from honk.api.webapp import SURFACES, build_app
from honk.connection.plane import Plane
from honk.core.clock import FakeClock
from honk.core.net import Network
from honk.daemon.app import Daemon
from honk.group.filter import node_id_of
from honk.group.manager import GroupManager
from honk.group.score.cells import Outcome
from honk.group.score.keys import ScoreTarget
from honk.group.score.ranker import CANDIDATE_COUNTERS, FINAL_REASONS

SECRET = "sc0re-secret"
TOKYO, OSAKA = "edge-tokyo-node", "edge-osaka-node"  # names distinctive enough to search the bodies for
SCORED = "scored"
TARGET_HOST = "private-target.example"  # must never appear in an answer
TARGET = ScoreTarget.of(TARGET_HOST, 443)
DESTINATION = ipaddress.ip_address("192.0.2.77")
RESOLVES = 5  # flows ranked through the Score group
GOOD, BAD = 8, 6  # outcomes that make one node clearly better than the other

ROUTED = f"""node {{
    {TOKYO}: 'socks5://127.0.0.1:9'
    {OSAKA}: 'socks5://127.0.0.1:19'
}}
group {{
    {SCORED} {{
        filter: name({TOKYO}, {OSAKA})
        policy: score
    }}
    pick {{
        filter: name(direct, {TOKYO})
    }}
}}
routing {{
    fallback: direct
}}
"""

GROUP_FIELDS = {
    "group",
    "network",
    "reasons",
    "candidates",
    "ordinarySwitch",
    "switchFlap",
    "coldAllowance",
    "coldSpent",
}
CACHE_FIELDS = {
    "exactEntries",
    "exactCapacity",
    "exactEvictions",
    "aggregateEntries",
    "aggregateCapacity",
    "aggregateEvictions",
}


class ScoreRanking:
    """The daemon as the API sees it, but serving a plane whose Score groups rank with the
    lineage's ScoreState. Writes still go to the daemon (its own plane)."""

    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon
        plane = daemon.plane
        assert plane is not None
        groups = GroupManager.build(
            plane.spec, plane.outbounds, health=plane.groups.health, clock=daemon.clock, score_ranking=True
        )
        self.plane: Plane = dataclasses.replace(plane, groups=groups)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._daemon, name)

    @property
    def groups(self) -> GroupManager:
        return self.plane.groups

    def node_id(self, name: str):  # noqa: ANN201 - a NodeId
        return node_id_of(self.plane.outbounds[name])

    def resolve(self, count: int = RESOLVES) -> None:
        for _ in range(count):
            self.groups.resolve(SCORED, Network.TCP, target=TARGET, destination=DESTINATION)

    def record(self, name: str, outcome: Outcome, count: int, target: ScoreTarget | None = TARGET) -> None:
        """Business outcomes as the relay's reporters would record them."""
        destination = DESTINATION if target is not None else None
        for _ in range(count):
            self.groups.score.evidence.record(
                SCORED, Network.TCP, target, self.node_id(name), outcome, self.clock.now(), destination
            )


@pytest.fixture
async def daemon(tmp_path):
    async with running_daemon(
        tmp_path, quiet_global(tmp_path / "var") + LAN_INBOUND + ROUTED, clock=FakeClock()
    ) as running:
        yield running


@pytest.fixture
def control(daemon) -> ScoreRanking:
    return ScoreRanking(daemon)


async def serve(control: Any):  # noqa: ANN201 - the client context manager
    return test_utils.TestClient(test_utils.TestServer(build_app(control, SECRET, SURFACES)))


@pytest.fixture
async def client(control):
    async with await serve(control) as http:
        yield http


async def get_json(client, path: str) -> tuple[dict, str]:  # noqa: ANN001
    response = await client.get(path, headers=bearer(SECRET))
    assert response.status == 200, await response.text()
    text = await response.text()
    return json.loads(text), text


def entry(score: dict, group: str = SCORED, network: str = "tcp") -> dict:
    (found,) = [e for e in score["groups"] if (e["group"], e["network"]) == (group, network)]
    return found


# --- /stats.score ----------------------------------------------------------------------------------


async def test_stats_score_counts_each_applied_rank_in_the_fixed_fields(client, control):
    control.record(TOKYO, Outcome.USEFUL, GOOD)
    control.resolve()
    body, _ = await get_json(client, "/v1/stats/score")
    assert set(body) == {"groups", "cache"}
    tcp = entry(body)
    assert set(tcp) == GROUP_FIELDS
    assert set(tcp["reasons"]) == set(FINAL_REASONS) and set(tcp["candidates"]) == set(CANDIDATE_COUNTERS)
    assert sum(tcp["reasons"].values()) == RESOLVES  # exactly one final reason per applied rank
    assert [e["network"] for e in body["groups"]] == ["tcp"]  # no UDP flow was ranked
    assert set(body["cache"]) == CACHE_FIELDS
    assert body["cache"]["exactEntries"] >= 1 and body["cache"]["aggregateEntries"] >= 1
    assert body == control.groups.score.stats()


async def test_stats_score_answers_only_with_the_api_secret(client):
    for path in ("/v1/stats/score", "/stats"):
        assert (await client.get(path)).status == 401, path
        assert (await client.get(path, headers={"Authorization": "Bearer wrong"})).status == 401, path
        assert (await client.get(path, headers=bearer(SECRET))).status == 200, path


async def test_stats_score_names_no_target_node_or_cell(client, control):
    control.record(TOKYO, Outcome.USEFUL, GOOD)
    control.record(OSAKA, Outcome.FAILURE, BAD)
    control.resolve()
    native, text = await get_json(client, "/v1/stats/score")
    stats, _ = await get_json(client, "/stats")
    part = json.dumps(stats["score"], ensure_ascii=False)  # the rest of /stats names outbounds, as it did
    assert entry(native)["reasons"] and entry(stats["score"])["reasons"]
    for private in (
        TARGET_HOST,
        str(DESTINATION),
        TOKYO,
        OSAKA,
        str(control.node_id(TOKYO)),
        str(control.node_id(OSAKA)),
    ):
        assert private not in text and private not in part, private


async def test_the_clash_stats_document_carries_the_same_score_part(client, control):
    control.resolve()
    stats, _ = await get_json(client, "/stats")
    native, _ = await get_json(client, "/v1/stats/score")
    assert stats["score"] == native
    assert {"outbounds", "tcp", "udp"} <= set(stats)  # the existing parts stay


async def test_reading_the_api_ranks_nothing_and_counts_nothing(client, control):
    control.record(OSAKA, Outcome.USEFUL, GOOD, target=None)
    control.resolve()
    before, scopes = control.groups.score.stats(), dict(control.groups.score.scopes)
    for path in (
        "/v1/stats/score",
        "/stats",
        f"/proxies/{SCORED}",
        "/proxies",
        f"/v1/groups/{SCORED}",
        "/metrics",
    ):
        assert (await client.get(path, headers=bearer(SECRET))).status == 200, path
    assert control.groups.score.stats() == before
    assert control.groups.score.scopes == scopes


async def test_a_daemon_before_any_score_rank_answers_an_empty_score_document(daemon):
    async with await serve(daemon) as http:
        body, _ = await get_json(http, "/v1/stats/score")
    assert body["groups"] == []
    assert set(body["cache"]) == CACHE_FIELDS and body["cache"]["exactEntries"] == 0


# --- /metrics ----------------------------------------------------------------------------------------


def score_series(parsed: dict) -> dict[tuple[str, frozenset], float]:
    return {key: v for key, v in parsed.items() if key[0].startswith("honk_score_")}


async def test_metrics_export_the_reason_counters_by_group_and_network_and_no_target(client, control):
    control.record(TOKYO, Outcome.USEFUL, GOOD)
    control.resolve()
    response = await client.get("/metrics", headers=bearer(SECRET))
    text = await response.text()
    parsed = metric_samples(text)
    reasons = entry(control.groups.score.stats())["reasons"]
    for reason in FINAL_REASONS:
        key = (
            "honk_score_reason_total",
            frozenset({("group", SCORED), ("network", "tcp"), ("reason", reason)}),
        )
        assert parsed[key] == reasons[reason], reason
    assert (
        sum(
            v
            for (name, labels), v in parsed.items()
            if name == "honk_score_reason_total" and ("network", "tcp") in labels
        )
        == RESOLVES
    )
    cache = control.groups.score.stats()["cache"]
    assert parsed[("honk_score_cache_entries", frozenset({("layer", "exact")}))] == cache["exactEntries"]
    assert (
        parsed[("honk_score_cache_capacity", frozenset({("layer", "aggregate")}))]
        == cache["aggregateCapacity"]
    )
    assert ("honk_score_cache_evictions_total", frozenset({("layer", "exact")})) in parsed
    allowed = {"group", "network", "reason", "counter", "layer"}
    for name, labels in score_series(parsed):
        assert {label for label, _ in labels} <= allowed, name
    for private in (TARGET_HOST, str(DESTINATION), TOKYO, OSAKA, str(control.node_id(TOKYO))):
        assert private not in text, private


async def test_a_configured_score_group_shows_at_zero_on_both_networks_before_any_rank(client):
    parsed = metric_samples(await (await client.get("/metrics", headers=bearer(SECRET))).text())
    for network in ("tcp", "udp"):
        scope = {("group", SCORED), ("network", network)}
        for reason in FINAL_REASONS:
            assert parsed[("honk_score_reason_total", frozenset({*scope, ("reason", reason)}))] == 0
        for counter in CANDIDATE_COUNTERS:
            assert parsed[("honk_score_candidate_total", frozenset({*scope, ("counter", counter)}))] == 0
        assert parsed[("honk_score_ordinary_switch_total", frozenset(scope))] == 0
        assert parsed[("honk_score_switch_flap_total", frozenset(scope))] == 0
    assert not [key for key in score_series(parsed) if ("group", "pick") in key[1]]  # Score groups only


# --- the Clash representation (GH-K-132) --------------------------------------------------------------


async def test_a_score_group_shows_as_urltest_with_the_aggregate_tcp_winner_as_now(client, control):
    control.record(TOKYO, Outcome.USEFUL, GOOD, target=None)
    control.record(OSAKA, Outcome.USEFUL, GOOD, target=None)
    control.record(TOKYO, Outcome.FAILURE, BAD, target=None)
    proxy, _ = await get_json(client, f"/proxies/{SCORED}")
    assert proxy["type"] == "URLTest"
    assert proxy["now"] == OSAKA == control.groups.resolve(SCORED, Network.TCP, peek=True).leaf.name
    assert "fixed" not in proxy  # nothing to pin, so nothing pinned to show


async def test_clash_put_and_delete_on_a_score_group_are_refused_and_pin_nothing(client, control):
    control.record(OSAKA, Outcome.USEFUL, GOOD, target=None)
    before, _ = await get_json(client, f"/proxies/{SCORED}")
    response = await client.put(f"/proxies/{SCORED}", json={"name": TOKYO}, headers=bearer(SECRET))
    assert response.status == 400 and await response.json() == {"message": "Must be a Selector"}
    response = await client.delete(f"/proxies/{SCORED}", headers=bearer(SECRET))
    assert response.status == 400
    after, _ = await get_json(client, f"/proxies/{SCORED}")
    assert after["now"] == before["now"]
    assert control.groups.pinned(SCORED) == {}


async def test_a_score_group_running_as_urltest_is_not_pinned_through_any_api(daemon):
    """Without Score ranking the manager runs the group as a (pinnable) URLTest: the API's
    configured-policy check is what keeps the pin path away from it."""
    async with await serve(daemon) as http:
        for method, path, body in (
            ("PUT", f"/proxies/{SCORED}", {"name": TOKYO}),
            ("DELETE", f"/proxies/{SCORED}", None),
            ("PUT", f"/v1/groups/{SCORED}/selection", {"member": TOKYO}),
            ("DELETE", f"/v1/groups/{SCORED}/selection", None),
        ):
            response = await http.request(method, path, json=body, headers=bearer(SECRET))
            assert response.status == 400, (method, path)
    assert daemon.plane.groups.pinned(SCORED) == {}
