"""The native /v1 API against a running daemon, through a real aiohttp client: every endpoint,
the typed error codes, selection writes per network, closing flows by group and node, config
checks, reloads and the log stream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from helpers.aio import close_writer, socks5_open
from helpers.apidaemon import LAN_INBOUND, api_base, api_block, bearer, quiet_global, running_daemon
from helpers.engines import STEP, poll
from helpers.origins import generate_204
from helpers.servers import EchoServer

from honk import __version__
from honk.daemon.app import Daemon

SECRET = "n4tive-secret"
NODE_PASSWORD = "p4ssw0rdXYZ"  # must never appear in an answer

ROUTED = """node {{
    a: 'socks5://user:{password}@127.0.0.1:9'
    b: 'socks5://127.0.0.1:19'
{extra_nodes}}}
group {{
    pick {{
        filter: name(direct, a)
    }}
    other {{
        filter: name(direct, b)
    }}
    auto {{
        filter: name(a, b)
        policy: min_moving_avg
    }}
    spread {{
        filter: name(a, b)
        policy: round_robin
    }}
    grün {{
        filter: name(b)
    }}
    scored {{
        filter: name(a, b)
        policy: score
    }}
}}
routing {{
    dport({pick_port}) -> pick
    dport({other_port}) -> other
    fallback: direct
}}
"""

GROUPS = ["pick", "other", "auto", "spread", "grün", "scored"]


def config_text(data_dir: Path, ports: tuple[int, int], extra_nodes: str = "") -> str:
    """``ports``: the destination ports routed to pick and to other."""
    routed = ROUTED.format(
        password=NODE_PASSWORD, extra_nodes=extra_nodes, pick_port=ports[0], other_port=ports[1]
    )
    return quiet_global(data_dir) + LAN_INBOUND + routed + api_block(SECRET)


@dataclass
class Api:
    daemon: Daemon
    session: aiohttp.ClientSession
    base: str
    config: Path
    ports: tuple[int, int]

    def write_config(self, extra_nodes: str = "") -> None:
        self.config.write_text(config_text(self.config.parent / "var", self.ports, extra_nodes))

    async def call(
        self,
        method: str,
        path: str,
        *,
        body: object = None,
        data: bytes | str | None = None,
        params: dict[str, str] | None = None,
    ) -> tuple[int, dict]:
        kwargs: dict = {"params": params}
        if body is not None:
            kwargs["json"] = body
        elif data is not None:
            kwargs["data"] = data
        async with self.session.request(method, self.base + path, **kwargs) as response:
            return response.status, await response.json()


@contextlib.asynccontextmanager
async def running(tmp_path: Path, ports: tuple[int, int] = (1, 2)) -> AsyncIterator[Api]:
    timeout = aiohttp.ClientTimeout(total=3 * STEP)
    async with (
        running_daemon(tmp_path, config_text(tmp_path / "var", ports)) as daemon,
        aiohttp.ClientSession(headers=bearer(SECRET), timeout=timeout) as session,
    ):
        yield Api(daemon, session, api_base(daemon), daemon.config_path, ports)


def error_code(body: dict) -> str:
    return body["error"]["code"]


# --- version, status, auth, openapi ----------------------------------------------------------


async def test_version_and_status_describe_the_running_daemon(tmp_path):
    async with running(tmp_path) as api:
        status, version = await api.call("GET", "/v1/version")
        assert status == 200
        assert version["version"] == __version__ and version["api"] == 1 and version["pid"] == os.getpid()
        assert version["started_at"].endswith("Z") and version["uptime_s"] >= 0
        status, summary = await api.call("GET", "/v1/status")
        assert status == 200
        host, port = api.daemon.api.bound
        assert summary["api"] == {"address": f"{host}:{port}"}
        assert summary["generation"] == 1 and summary["mode"] == "rule"
        assert summary["groups"] == len(GROUPS) and summary["nodes"] == {"total": 2, "alive": 2}
        assert summary["connections"] == {"tcp": 0, "udp": 0}


async def test_a_request_without_the_secret_gets_the_native_unauthorized_body(tmp_path):
    async with running(tmp_path) as api, aiohttp.ClientSession() as bare:
        async with bare.get(api.base + "/v1/groups") as response:
            assert response.status == 401
            assert error_code(await response.json()) == "unauthorized"


async def test_an_unknown_path_gets_resource_not_found(tmp_path):
    async with running(tmp_path) as api:
        status, body = await api.call("GET", "/v1/nothing-here")
        assert (status, error_code(body)) == (404, "resource_not_found")


async def test_the_openapi_document_is_served_and_lists_the_native_paths(tmp_path):
    async with running(tmp_path) as api:
        status, doc = await api.call("GET", "/v1/openapi.json")
        assert status == 200 and doc["openapi"].startswith("3.1")
        assert "/v1/groups/{name}/selection" in doc["paths"]


# --- groups and selection writes ---------------------------------------------------------------


async def test_groups_are_listed_in_config_order_and_a_non_ascii_name_is_reachable(tmp_path):
    async with running(tmp_path) as api:
        status, body = await api.call("GET", "/v1/groups")
        assert status == 200
        assert [g["name"] for g in body["groups"]] == GROUPS
        status, group = await api.call("GET", "/v1/groups/grün")
        assert status == 200 and group["members"] == ["b"] and group["chain"]["tcp"] == ["grün", "b"]
        status, body = await api.call("GET", "/v1/groups/nope")
        assert (status, error_code(body)) == (404, "group_not_found")


async def test_a_selection_for_one_network_changes_only_that_network(tmp_path):
    async with running(tmp_path) as api:
        status, body = await api.call(
            "PUT", "/v1/groups/pick/selection", body={"member": "direct", "network": "udp"}
        )
        assert status == 200
        assert body == {"group": "pick", "member": "direct", "network": "udp", "changed": ["udp"]}
        _, group = await api.call("GET", "/v1/groups/pick")
        assert group["choice"] == {"tcp": "a", "udp": "direct"}
        assert group["selection"] == {"tcp": "a", "udp": "direct"}
        status, body = await api.call("PUT", "/v1/groups/pick/selection", body={"member": "direct"})
        assert body["network"] == "both" and body["changed"] == ["tcp"]


async def test_a_both_write_with_an_unknown_member_changes_neither_network(tmp_path):
    async with running(tmp_path) as api:
        await api.call("PUT", "/v1/groups/pick/selection", body={"member": "direct", "network": "tcp"})
        _, before = await api.call("GET", "/v1/groups/pick")
        status, body = await api.call("PUT", "/v1/groups/pick/selection", body={"member": "zzz"})
        assert (status, error_code(body)) == (400, "member_not_found")
        _, after = await api.call("GET", "/v1/groups/pick")
        assert after["choice"] == before["choice"] == {"tcp": "direct", "udp": "a"}
        status, body = await api.call("PUT", "/v1/groups/nope/selection", body={"member": "a"})
        assert (status, error_code(body)) == (404, "group_not_found")


async def test_loadbalance_and_score_take_no_selection_and_a_selector_has_no_pin_to_remove(tmp_path):
    async with running(tmp_path) as api:
        for group in ("spread", "scored"):
            status, body = await api.call("PUT", f"/v1/groups/{group}/selection", body={"member": "a"})
            assert (status, error_code(body)) == (400, "not_a_selector"), group
            status, body = await api.call("DELETE", f"/v1/groups/{group}/selection")
            assert (status, error_code(body)) == (400, "not_a_selector"), group
        status, body = await api.call("DELETE", "/v1/groups/pick/selection")
        assert (status, error_code(body)) == (400, "not_a_selector")


async def test_a_urltest_group_is_pinned_per_network_and_unpinned(tmp_path):
    async with running(tmp_path) as api:
        status, body = await api.call(
            "PUT", "/v1/groups/auto/selection", body={"member": "b", "network": "tcp"}
        )
        assert status == 200 and body["changed"] == ["tcp"]
        _, group = await api.call("GET", "/v1/groups/auto")
        assert group["pinned"] == {"tcp": "b", "udp": None} and group["selection"]["tcp"] == "b"
        assert group["choice"] is None
        status, body = await api.call("DELETE", "/v1/groups/auto/selection", params={"network": "tcp"})
        assert (status, body) == (200, {"group": "auto", "cleared": ["tcp"]})
        _, group = await api.call("GET", "/v1/groups/auto")
        assert group["pinned"] == {"tcp": None, "udp": None}


async def test_malformed_bodies_and_fields_are_invalid_requests_naming_the_field(tmp_path):
    async with running(tmp_path) as api:
        status, body = await api.call("PUT", "/v1/groups/pick/selection", data="{not json")
        assert (status, error_code(body)) == (400, "invalid_request")
        status, body = await api.call("PUT", "/v1/groups/pick/selection", body=["direct"])
        assert (status, error_code(body)) == (400, "invalid_request")
        status, body = await api.call("PUT", "/v1/groups/pick/selection", body={"member": 5})
        assert (status, error_code(body)) == (400, "invalid_request") and "member" in body["error"]["message"]
        status, body = await api.call(
            "PUT", "/v1/groups/pick/selection", body={"member": "direct", "network": "sideways"}
        )
        assert status == 400 and "network" in body["error"]["message"]
        status, body = await api.call("POST", "/v1/delay", body={"target": "direct", "timeout_ms": 40000})
        assert status == 400 and "timeout_ms" in body["error"]["message"]
        status, body = await api.call("POST", "/v1/delay", body={"timeout_ms": 100})
        assert status == 400 and "target" in body["error"]["message"]


# --- nodes and delay tests ---------------------------------------------------------------------


async def test_nodes_list_the_builtins_first_and_never_a_credential(tmp_path):
    async with running(tmp_path) as api:
        async with api.session.get(api.base + "/v1/nodes") as response:
            text = await response.text()
        assert NODE_PASSWORD not in text
        nodes = json.loads(text)["nodes"]
        assert [n["name"] for n in nodes] == ["direct", "block", "a", "b"]
        assert nodes[0]["id"] is None and nodes[0]["health"] == {}
        status, node = await api.call("GET", "/v1/nodes/a")
        assert status == 200 and node["server"] == "127.0.0.1:9" and node["protocol"] == "socks5"
        assert node["id"] == str(api.daemon.plane.outbounds["a"].runtime.node_id)
        status, body = await api.call("GET", "/v1/nodes/nope")
        assert (status, error_code(body)) == (404, "node_not_found")


async def test_a_delay_test_measures_through_direct_and_reports_a_refusing_node_as_an_error(tmp_path):
    async with running(tmp_path) as api, generate_204() as origin:
        url = f"http://127.0.0.1:{origin.port}/generate_204"
        status, body = await api.call(
            "POST", "/v1/delay", body={"target": "direct", "url": url, "timeout_ms": 3000}
        )
        assert status == 200 and body["kind"] == "node" and body["url"] == url
        result = body["results"]["direct"]
        assert result["error"] == "" and result["delay_ms"] > 0
        status, body = await api.call(
            "POST", "/v1/delay", body={"target": "spread", "url": url, "timeout_ms": 3000}
        )
        assert status == 200 and body["kind"] == "group"
        assert set(body["results"]) == {"a", "b"}
        assert all(r["delay_ms"] is None and r["error"] for r in body["results"].values())
        status, body = await api.call("POST", "/v1/delay", body={"target": "nope"})
        assert (status, error_code(body)) == (404, "node_not_found")


# --- connections ---------------------------------------------------------------------------------


async def test_closing_by_group_closes_only_that_groups_flows_then_by_node_and_by_id(tmp_path):
    with EchoServer() as first, EchoServer() as second:
        async with running(tmp_path, (first.port, second.port)) as api:
            for group in ("pick", "other"):
                await api.call("PUT", f"/v1/groups/{group}/selection", body={"member": "direct"})
            port = api.daemon.inbounds["lan"].bound.port
            opened = []
            try:
                for target in (first.port, second.port):
                    reader, writer, code, _ = await socks5_open(port, "127.0.0.1", target)
                    assert code == 0
                    opened.append((reader, writer))
                await poll(lambda: len(api.daemon.tracker.snapshot()) == 2, "two tracked flows")
                status, body = await api.call("GET", "/v1/connections")
                assert status == 200
                assert sorted(c["chain"] for c in body["connections"]) == [
                    ["other", "direct"],
                    ["pick", "direct"],
                ]
                assert all(c["network"] == "tcp" and c["inbound"] == "lan" for c in body["connections"])

                status, body = await api.call("DELETE", "/v1/connections")
                assert (status, error_code(body)) == (400, "filter_required")
                status, body = await api.call("DELETE", "/v1/connections", params={"group": "pick"})
                assert (status, body) == (200, {"closed": 1})
                assert await asyncio.wait_for(opened[0][0].read(), STEP) == b""
                opened[1][1].write(b"still here")
                assert await asyncio.wait_for(opened[1][0].readexactly(10), STEP) == b"still here"
                _, body = await api.call("GET", "/v1/connections")
                assert [c["chain"] for c in body["connections"]] == [["other", "direct"]]

                status, body = await api.call("DELETE", "/v1/connections", params={"group": "nope"})
                assert (status, error_code(body)) == (404, "group_not_found")
                status, body = await api.call("DELETE", "/v1/connections", params={"node": "direct"})
                assert (status, body) == (200, {"closed": 1})
                assert await asyncio.wait_for(opened[1][0].read(), STEP) == b""

                reader, writer, code, _ = await socks5_open(port, "127.0.0.1", first.port)
                opened.append((reader, writer))
                await poll(lambda: len(api.daemon.tracker.snapshot()) == 1, "one tracked flow")
                flow_id = api.daemon.tracker.snapshot()[0].id
                status, body = await api.call("DELETE", f"/v1/connections/{flow_id}")
                assert (status, body) == (200, {"closed": 1})
                status, body = await api.call("DELETE", f"/v1/connections/{flow_id}")
                assert (status, error_code(body)) == (404, "connection_not_found")
                _, body = await api.call("GET", "/v1/connections")
                assert body["connections"] == [] and body["totals"]["up"] >= 10
            finally:
                for _, writer in opened:
                    await close_writer(writer)


# --- config check and reload -----------------------------------------------------------------------


VALID = """node {
    a: 'socks5://127.0.0.1:9'
}
group {
    g {
        filter: name(a)
        policy: bogus
    }
}
routing {
    fallback: g
}
"""

INVALID = VALID.replace("    fallback: g\n", "    dport(abc) -> g\n    fallback: g\n")


async def test_a_config_check_accepts_a_valid_body_and_locates_the_errors_of_an_invalid_one(tmp_path):
    async with running(tmp_path) as api:
        status, body = await api.call("POST", "/v1/config/check", data=VALID, params={"format": "dae"})
        assert status == 200 and body["ok"] is True
        assert "1 node(s), 1 group(s)" in body["summary"]
        assert [(d["severity"], d["code"], d["line"]) for d in body["diagnostics"]] == [
            ("warning", "unknown-policy", 7)
        ]
        status, body = await api.call("POST", "/v1/config/check", data=INVALID)
        assert (status, error_code(body)) == (422, "config_invalid")
        errors = [d for d in body["diagnostics"] if d["severity"] == "error"]
        assert [(d["key_path"], d["line"]) for d in errors] == [("routing.rules[0]", 11)]
        status, body = await api.call("POST", "/v1/config/check", data=VALID, params={"format": "yaml"})
        assert status == 400 and "format" in body["error"]["message"]
        assert api.daemon.generation == 1  # a check applies nothing


async def test_a_reload_of_a_changed_file_is_applied_with_a_new_generation(tmp_path):
    async with running(tmp_path) as api:
        api.write_config(extra_nodes="    c: 'socks5://127.0.0.1:29'\n")
        status, body = await api.call("POST", "/v1/reload", params={"allow_disruptive": "true"})
        assert status == 200 and body["applied"] and body["generation"] == body["epoch"] == 2
        assert body["built"][0] == "outbound c@v1" and body["drained"] == body["removed"] == []
        assert body["summary"].startswith("built [outbound c@v1")
        status, _ = await api.call("GET", "/v1/nodes/c")
        assert status == 200
        api.config.write_text("node {\n    broken\n")
        status, body = await api.call("POST", "/v1/reload")
        assert status == 400 and error_code(body) == "reload_config"
        assert api.daemon.generation == 2


# --- logs ------------------------------------------------------------------------------------------


async def test_the_log_stream_sends_ndjson_lines_and_an_unknown_level_is_refused(tmp_path):
    async with running(tmp_path) as api:
        status, body = await api.call("GET", "/v1/logs", params={"level": "loud"})
        assert (status, error_code(body)) == (400, "invalid_request")
        async with api.session.get(api.base + "/v1/logs", params={"level": "info"}) as response:
            assert response.status == 200
            await poll(lambda: api.daemon.logs.readers == 1, "the stream to subscribe")
            api.write_config(extra_nodes="    c: 'socks5://127.0.0.1:29'\n")
            assert await api.daemon.reload()  # logs "config reloaded: ..." at info
            while True:
                line = json.loads(await asyncio.wait_for(response.content.readline(), STEP))
                assert set(line) == {"time", "level", "logger", "message"}
                assert line["level"] in ("info", "warning", "error")
                if line["message"].startswith("config reloaded: "):
                    break
        await poll(lambda: api.daemon.logs.readers == 0, "the stream to unsubscribe after the client left")
