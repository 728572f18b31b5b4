"""The Clash API replay checklist (clash-api.md §8) against a running daemon with real nodes.

A Shadowsocks node (ss-server) reaches loopback HTTP origins; a node whose server refuses
and one whose server accepts and stays silent make the failure paths. Every request goes
through a real aiohttp client to the daemon's API listener.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import quote

import aiohttp
import aiohttp.web
import pytest
import yarl
from helpers.apidaemon import LAN_INBOUND, api_base, api_block, api_port, bearer, quiet_global, running_daemon
from helpers.engines import poll
from helpers.origins import generate_204
from helpers.peers import require_binary
from helpers.peerservers import ss_server
from helpers.servers import free_port

from honk.daemon.app import Daemon

SECRET = "hunter2"
SS_METHOD, SS_PASSWORD = "chacha20-ietf-poly1305", "clash-api-pass"
JAPAN = "🇯🇵 Japan 04"  # a Selector whose name has spaces and an emoji
SLACK = 1.0  # seconds a delay answer may come after its timeout

ROUTED = """node {{
    hk-01: 'ss://{ss}@127.0.0.1:{ss_port}'
    dead: 'socks5://127.0.0.1:{closed_port}'
    slow: 'socks5://127.0.0.1:{silent_port}'
}}
group {{
    Proxy {{
        filter: name(hk-01)
        filter: group(Auto, {japan}, Fall back, LB)
    }}
    Auto {{
        filter: name(hk-01, dead)
        policy: min_moving_avg
    }}
    {japan} {{
        filter: name(hk-01, dead)
    }}
    Fall back {{
        filter: name(dead, hk-01)
        policy: fallback
    }}
    LB {{
        filter: name(hk-01, dead)
        policy: roundrobin
    }}
    Down {{
        filter: name(dead, slow)
        policy: fallback
    }}
    Smart {{
        filter: name(hk-01, dead)
        policy: score
    }}
}}
routing {{
    dport(22) -> direct
    fallback: Proxy
}}
"""


@dataclass
class Api:
    daemon: Daemon
    base: str
    port: int
    http: aiohttp.ClientSession
    check_204: str  # a URL answering 204
    check_200: str  # a URL answering 200

    def url(self, path: str) -> str:
        return self.base + path

    async def get(self, path: str, **kwargs) -> tuple[int, object]:
        async with self.http.get(self.url(path), **kwargs) as resp:
            return resp.status, await _body(resp)

    async def put(self, path: str | yarl.URL, body: object = None) -> tuple[int, object]:
        url = path if isinstance(path, yarl.URL) else self.url(path)
        async with self.http.put(url, json=body) as resp:
            return resp.status, await _body(resp)

    async def delete(self, path: str) -> tuple[int, object]:
        async with self.http.delete(self.url(path)) as resp:
            return resp.status, await _body(resp)

    async def proxy(self, name: str) -> dict:
        status, body = await self.get("/proxies/" + quote(name, safe=""))
        assert status == 200, body
        return body


async def _body(resp: aiohttp.ClientResponse) -> object:
    text = await resp.text()
    return await resp.json(content_type=None) if text else None


def _userinfo() -> str:
    return base64.urlsafe_b64encode(f"{SS_METHOD}:{SS_PASSWORD}".encode()).decode().rstrip("=")


@contextlib.asynccontextmanager
async def silent_server() -> AsyncIterator[int]:
    """Accepts connections and never answers: a node whose handshake hangs."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)

    server = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


@pytest.fixture
def ss_peer():
    require_binary("ss-server")
    with ss_server(SS_METHOD, SS_PASSWORD, udp=False) as peer:
        yield peer


@pytest.fixture
async def api(tmp_path, ss_peer) -> AsyncIterator[Api]:
    async with contextlib.AsyncExitStack() as stack:
        origin = await stack.enter_async_context(generate_204())
        ok_origin = await stack.enter_async_context(generate_204(status=b"200 OK"))
        silent_port = await stack.enter_async_context(silent_server())
        routed = ROUTED.format(
            ss=_userinfo(),
            ss_port=ss_peer.port,
            closed_port=free_port(),
            silent_port=silent_port,
            japan=JAPAN,
        )
        text = quiet_global() + LAN_INBOUND + routed + api_block(SECRET)
        daemon = await stack.enter_async_context(running_daemon(tmp_path, text))
        http = await stack.enter_async_context(aiohttp.ClientSession(headers=bearer(SECRET)))
        yield Api(
            daemon,
            api_base(daemon),
            api_port(daemon),
            http,
            f"http://127.0.0.1:{origin.port}/generate_204",
            f"http://127.0.0.1:{ok_origin.port}/ok",
        )


async def raw_request(port: int, request_line: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """One request written byte for byte (a target no client library would send as is)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            request_line
            + b"\r\nHost: 127.0.0.1\r\nAuthorization: Bearer "
            + SECRET.encode()
            + b"\r\nContent-Type: application/json\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\nConnection: close\r\n\r\n"
            + body
        )
        response = await asyncio.wait_for(reader.read(), 5.0)
    finally:
        writer.close()
    status = int(response.split(b" ", 2)[1])
    return status, response.partition(b"\r\n\r\n")[2]


# --- 1, 2: connect --------------------------------------------------------------------------------


async def test_version_needs_the_bearer_secret_and_reports_meta(api):
    async with aiohttp.ClientSession() as anonymous:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {SECRET}"}):
            async with anonymous.get(api.url("/version"), headers=headers) as resp:
                assert resp.status == 401
                assert await resp.json() == {"message": "Unauthorized"}
    status, body = await api.get("/version")
    assert status == 200 and body["meta"] is True and body["version"].startswith("honk ")
    assert "premium" not in body


async def test_a_dashboard_preflight_succeeds_without_a_token_and_allows_private_network(api):
    async with aiohttp.ClientSession() as anonymous:
        async with anonymous.options(
            api.url("/proxies"),
            headers={
                "Origin": "https://board.zash.run.place",
                "Access-Control-Request-Method": "PUT",
                "Access-Control-Request-Headers": "authorization,content-type",
                "Access-Control-Request-Private-Network": "true",
            },
        ) as resp:
            assert 200 <= resp.status < 300
            assert resp.headers["Access-Control-Allow-Origin"] in ("*", "https://board.zash.run.place")
            assert "PUT" in resp.headers["Access-Control-Allow-Methods"]
            allowed = resp.headers["Access-Control-Allow-Headers"].lower()
            assert "authorization" in allowed and "content-type" in allowed
            assert resp.headers["Access-Control-Allow-Private-Network"] == "true"


# --- 3: the proxies page ----------------------------------------------------------------------------


async def test_proxies_list_groups_with_members_and_global_orders_them(api):
    status, body = await api.get("/proxies")
    assert status == 200
    listed = body["proxies"]
    groups = [name for name, p in listed.items() if p.get("all")]
    assert set(groups) == {"Proxy", "Auto", JAPAN, "Fall back", "LB", "Down", "Smart", "GLOBAL"}
    assert {listed[g]["type"] for g in groups} == {"Selector", "URLTest", "Fallback", "LoadBalance"}
    assert listed["Auto"]["type"] == "URLTest" and listed["Fall back"]["type"] == "Fallback"
    assert listed["Smart"]["type"] == "URLTest"  # Score has no Clash type
    order = listed["GLOBAL"]["all"]
    assert order[:2] == ["DIRECT", "REJECT"]
    config_order = ["Proxy", "Auto", JAPAN, "Fall back", "LB", "Down", "Smart"]
    assert [g for g in order if g in config_order] == config_order
    assert listed["hk-01"]["type"] == "Shadowsocks" and listed["hk-01"]["udp"] is True
    assert SS_PASSWORD not in str(body) and _userinfo() not in str(body)


async def test_one_proxy_and_the_group_listing_and_an_unknown_name(api):
    proxy = await api.proxy("Proxy")
    assert proxy["name"] == "Proxy" and proxy["now"] == "hk-01"
    status, body = await api.get("/group")
    assert status == 200 and [p["name"] for p in body["proxies"]][-1] == "GLOBAL"
    status, body = await api.get("/group/Auto")
    assert status == 200 and body["type"] == "URLTest"
    status, body = await api.get("/proxies/nothing-here")
    assert status == 404 and body == {"message": "Resource not found"}


# --- 4: selection -------------------------------------------------------------------------------


async def test_put_selects_a_selector_member_and_now_follows(api):
    assert await api.put("/proxies/Proxy", {"name": "Auto"}) == (204, None)
    assert (await api.proxy("Proxy"))["now"] == "Auto"
    assert await api.put("/proxies/Proxy", {"name": "hk-01"}) == (204, None)
    assert (await api.proxy("Proxy"))["now"] == "hk-01"
    # a Clash write sets both networks
    from honk.core.net import Network

    assert api.daemon.plane.groups.policy("Proxy").chosen(Network.UDP) == "hk-01"


async def test_put_on_a_leaf_load_balancer_or_score_group_is_refused_with_a_message(api):
    for name in ("hk-01", "LB", "Smart", "DIRECT"):
        status, body = await api.put("/proxies/" + name, {"name": "hk-01"})
        assert status == 400 and body == {"message": "Must be a Selector"}


async def test_put_with_a_non_member_or_bad_body_is_400_and_an_unknown_group_404(api):
    status, body = await api.put("/proxies/Proxy", {"name": "slow"})
    assert status == 400 and body["message"]
    status, body = await api.put("/proxies/Proxy", {"nope": 1})
    assert status == 400 and body == {"message": "Body invalid"}
    status, body = await api.put("/proxies/Nowhere", {"name": "hk-01"})
    assert status == 404


async def test_a_name_with_spaces_and_an_emoji_is_reached_encoded_and_encoded_twice(api):
    once = yarl.URL(api.url("/proxies/" + quote(JAPAN, safe="")), encoded=True)  # encodeURIComponent
    assert await api.put(once, {"name": "dead"}) == (204, None)
    assert (await api.proxy(JAPAN))["now"] == "dead"
    twice = yarl.URL(api.url("/proxies/" + quote(quote(JAPAN, safe=""), safe="")), encoded=True)
    assert await api.put(twice, {"name": "hk-01"}) == (204, None)
    assert (await api.proxy(JAPAN))["now"] == "hk-01"
    # the browser's own escaping of a name put in the path unencoded (Yacd-meta): spaces as %20
    browser = yarl.URL(api.url("/proxies/" + quote(JAPAN, safe="/?#")), encoded=True)
    assert await api.put(browser, {"name": "dead"}) == (204, None)
    status, body = await api.get("/group/" + quote(JAPAN, safe=""))
    assert status == 200 and body["now"] == "dead"


async def test_a_name_with_raw_spaces_and_utf8_in_the_request_line_is_reached(api):
    status, _ = await raw_request(api.port, f"PUT /proxies/{JAPAN} HTTP/1.1".encode(), b'{"name":"dead"}')
    assert status == 204
    assert (await api.proxy(JAPAN))["now"] == "dead"


async def test_put_on_automatic_groups_pins_them_and_delete_unpins(api):
    assert await api.put("/proxies/Fall%20back", {"name": "hk-01"}) == (204, None)
    shown = await api.proxy("Fall back")
    assert shown["fixed"] == "hk-01" and shown["now"] == "hk-01"
    assert await api.put("/proxies/Auto", {"name": "dead"}) == (204, None)
    assert (await api.proxy("Auto"))["fixed"] == "dead"
    assert await api.delete("/proxies/Fall%20back") == (204, None)
    assert (await api.proxy("Fall back"))["fixed"] == ""
    status, body = await api.delete("/proxies/Proxy")
    assert status == 400 and body["message"]


async def test_put_on_global_sets_what_the_global_mode_serves(api):
    assert await api.put("/proxies/GLOBAL", {"name": "Auto"}) == (204, None)
    assert (await api.proxy("GLOBAL"))["now"] == "Auto"
    assert api.daemon.mode.global_choice == "Auto"
    assert await api.put("/proxies/GLOBAL", {"name": "REJECT"}) == (204, None)
    assert api.daemon.mode.global_choice == "block"
    status, _ = await api.put("/proxies/GLOBAL", {"name": "nothing"})
    assert status == 400


# --- 5, 6: delay tests -------------------------------------------------------------------------


async def test_a_node_delay_through_shadowsocks_is_whole_milliseconds_and_recorded(api):
    status, body = await api.get("/proxies/hk-01/delay", params={"url": api.check_204, "timeout": "5000"})
    assert status == 200 and isinstance(body["delay"], int) and 0 < body["delay"] < 5000
    leaf = await api.proxy("hk-01")
    assert leaf["extra"][api.check_204]["alive"] is True
    assert leaf["extra"][api.check_204]["history"][-1]["delay"] == body["delay"]


async def test_a_refused_node_answers_503_within_its_timeout(api):
    started = time.monotonic()
    status, body = await api.get("/proxies/dead/delay", params={"url": api.check_204, "timeout": "2000"})
    assert status == 503 and body == {"message": "An error occurred in the delay test"}
    assert time.monotonic() - started < 2.0 + SLACK
    history = (await api.proxy("dead"))["extra"][api.check_204]["history"]
    assert history[-1]["delay"] == 0


async def test_a_silent_node_answers_504_within_its_timeout_plus_a_second(api):
    started = time.monotonic()
    status, body = await api.get("/proxies/slow/delay", params={"url": api.check_204, "timeout": "800"})
    elapsed = time.monotonic() - started
    assert status == 504 and body == {"message": "Timeout"}
    assert 0.7 <= elapsed < 0.8 + SLACK


async def test_expected_204_fails_an_origin_that_answers_200(api):
    status, body = await api.get(
        "/proxies/hk-01/delay", params={"url": api.check_200, "timeout": "5000", "expected": "204"}
    )
    assert status == 503 and body["message"]
    history = (await api.proxy("hk-01"))["extra"][api.check_200]["history"]
    assert [h["delay"] for h in history] == [0]  # one entry: the verdict
    status, body = await api.get(
        "/proxies/hk-01/delay", params={"url": api.check_204, "timeout": "5000", "expected": "200-204"}
    )
    assert status == 200 and body["delay"] > 0
    status, body = await api.get("/proxies/hk-01/delay", params={"url": api.check_200, "timeout": "5000"})
    assert status == 200  # no filter: any status the probe accepts
    status, _ = await api.get("/proxies/hk-01/delay", params={"url": api.check_204, "expected": "abc"})
    assert status == 400


async def test_a_group_delay_returns_only_successful_members_and_clears_a_pin(api):
    assert await api.put("/proxies/Auto", {"name": "dead"}) == (204, None)
    started = time.monotonic()
    status, body = await api.get("/group/Auto/delay", params={"url": api.check_204, "timeout": "3000"})
    assert time.monotonic() - started < 3.0 + SLACK
    assert status == 200 and set(body) == {"hk-01"} and body["hk-01"] > 0
    assert (await api.proxy("Auto"))["fixed"] == ""
    status, body = await api.get("/proxies/Proxy/delay", params={"url": api.check_204, "timeout": "3000"})
    assert status == 200 and body["delay"] > 0  # a group measures its current leaf


async def test_a_delay_test_of_a_score_group_creates_no_score_evidence(api):
    # GH-L-11, GH-F-26: delay tests feed the latency history, never Score's cells or counters
    score = api.daemon.plane.groups.score
    before = (score.evidence.stats(), score.stats())  # (the heuristic may hear the daemon's own probes)
    status, body = await api.get("/group/Smart/delay", params={"url": api.check_204, "timeout": "3000"})
    assert status == 200 and set(body) == {"hk-01"}
    status, _ = await api.get("/proxies/hk-01/delay", params={"url": api.check_204, "timeout": "3000"})
    assert status == 200
    assert (score.evidence.stats(), score.stats()) == before


async def test_a_group_whose_members_all_fail_answers_504_within_its_timeout(api):
    started = time.monotonic()
    status, body = await api.get("/group/Down/delay", params={"url": api.check_204, "timeout": "800"})
    assert status == 504 and body == {"message": "Timeout"}
    assert time.monotonic() - started < 0.8 + SLACK


# --- 7: providers and rules ------------------------------------------------------------------------


async def test_providers_answer_200_with_default_and_compatible_entries(api):
    status, body = await api.get("/providers/proxies")
    assert status == 200
    providers = body["providers"]
    assert providers["default"]["vehicleType"] == "Compatible"
    assert providers["Auto"]["vehicleType"] == "Compatible"
    assert [p["name"] for p in providers["Auto"]["proxies"]] == ["hk-01", "dead"]
    status, one = await api.get("/providers/proxies/Auto")
    assert status == 200 and one["name"] == "Auto"
    assert (await api.get("/providers/proxies/none"))[0] == 404
    assert await api.put("/providers/proxies/Auto") == (204, None)
    status, body = await api.get(
        "/providers/proxies/Auto/hk-01/healthcheck", params={"url": api.check_204, "timeout": "5000"}
    )
    assert status == 200 and body["delay"] > 0
    status, _ = await api.get(
        "/providers/proxies/Fall%20back/healthcheck", params={"url": api.check_200, "timeout": "3000"}
    )
    assert status == 204
    dead_history = (await api.proxy("dead"))["extra"][api.check_200]["history"]
    assert [h["delay"] for h in dead_history] == [0]  # every member was measured, the dead one too
    assert (await api.proxy("hk-01"))["extra"][api.check_200]["history"][-1]["delay"] > 0


USERINFO = "upload=1024; download=2048; total=1000000000000; expire=1767225600"


async def test_a_subscription_is_an_http_provider_that_a_put_refreshes(tmp_path):
    fetches = []
    fail = asyncio.Event()

    async def serve(request: aiohttp.web.Request) -> aiohttp.web.Response:
        fetches.append(request.path)
        if fail.is_set():
            return aiohttp.web.Response(status=500)
        return aiohttp.web.Response(
            text="socks5://127.0.0.1:1081#sub-a\nsocks5://127.0.0.1:1082#sub-b\n",
            headers={"Subscription-Userinfo": USERINFO},
        )

    app = aiohttp.web.Application()
    app.router.add_get("/sub", serve)
    runner = aiohttp.web.AppRunner(app)
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    origin_port = runner.addresses[0][1]
    subscription = f"subscription {{\n    paid: 'http://127.0.0.1:{origin_port}/sub'\n}}\n"
    text = quiet_global() + subscription + "routing {\n    fallback: direct\n}\n" + api_block(SECRET)
    try:
        async with (
            running_daemon(tmp_path, text) as daemon,
            aiohttp.ClientSession(headers=bearer(SECRET)) as http,
        ):
            base = api_base(daemon)
            async with http.get(base + "/providers/proxies") as resp:
                provider = (await resp.json())["providers"]["paid"]
            assert provider["vehicleType"] == "HTTP" and provider["type"] == "Proxy"
            assert [p["name"] for p in provider["proxies"]] == ["sub-a", "sub-b"]
            assert provider["proxies"][0]["provider-name"] == "paid" and "updatedAt" in provider
            assert provider["subscriptionInfo"] == {
                "Upload": 1024,
                "Download": 2048,
                "Total": 10**12,
                "Expire": 1767225600,
            }  # mihomo's capitalised keys
            before = len(fetches)
            async with http.put(base + "/providers/proxies/paid") as resp:
                assert resp.status == 204
            assert len(fetches) == before + 1
            fail.set()
            async with http.put(base + "/providers/proxies/paid") as resp:
                assert resp.status == 503 and (await resp.json())["message"]
            async with http.put(base + "/providers/proxies/nothing") as resp:
                assert resp.status == 404
    finally:
        await runner.cleanup()


async def test_rules_and_rule_providers(api):
    status, body = await api.get("/rules")
    assert status == 200
    never = {
        "disabled": False,
        "hitCount": 0,
        "hitAt": "0001-01-01T00:00:00Z",
        "missCount": 0,
        "missAt": "0001-01-01T00:00:00Z",
    }  # no flow yet (counters: test_clash_rules.py)
    assert body["rules"] == [
        {"index": 0, "type": "DstPort", "payload": "22", "proxy": "DIRECT", "size": -1, "extra": never},
        {"index": 1, "type": "Match", "payload": "", "proxy": "Proxy", "size": -1, "extra": never},
    ]
    assert await api.get("/providers/rules") == (200, {"providers": {}})


# --- 10: configs -----------------------------------------------------------------------------------


async def test_patch_configs_mode_global_shows_in_get_configs(api):
    async with api.http.patch(api.url("/configs"), json={"mode": "global"}) as resp:
        assert resp.status == 204
    status, body = await api.get("/configs")
    assert status == 200 and body["mode"] == "global" and api.daemon.mode.mode == "global"
    assert body["mixed-port"] == api.daemon.inbounds["lan"].bound.port and body["allow-lan"] is False
    async with api.http.patch(api.url("/configs"), json={"mode": "Rule", "allow-lan": True}) as resp:
        assert resp.status == 204  # keys honk does not apply are ignored, as mihomo does
    assert (await api.get("/configs"))[1]["mode"] == "rule"
    async with api.http.patch(api.url("/configs"), json={"mode": "sideways"}) as resp:
        assert resp.status == 400 and (await resp.json())["message"]


async def test_patch_configs_log_level_changes_the_running_level(api):
    async with api.http.patch(api.url("/configs"), json={"log-level": "warning"}) as resp:
        assert resp.status == 204
    assert (await api.get("/configs"))[1]["log-level"] == "warning"
    async with api.http.patch(api.url("/configs"), json={"log-level": "loud"}) as resp:
        assert resp.status == 400


async def test_put_configs_reloads_the_own_file_and_refuses_a_payload(api):
    generation = api.daemon.generation
    text = api.daemon.config_path.read_text()
    api.daemon.config_path.write_text(text + "\nnode {\n    added: 'socks5://127.0.0.1:9'\n}\n")
    async with api.http.put(
        api.url("/configs"), params={"force": "true"}, json={"path": "", "payload": ""}
    ) as resp:
        assert resp.status == 204
    assert api.daemon.generation == generation + 1 and "added" in api.daemon.plane.outbounds
    async with api.http.put(api.url("/configs"), json={"path": "", "payload": "mode: rule"}) as resp:
        assert resp.status == 400
        assert (await resp.json())["message"] == "honk reloads only its own configuration file"
    async with api.http.put(api.url("/configs"), json={"path": "/etc/other.yaml", "payload": ""}) as resp:
        assert resp.status == 400
    api.daemon.config_path.write_text("this is not a config {")
    async with api.http.put(api.url("/configs"), params={"reload": "true"}, json={}) as resp:
        assert resp.status == 400 and (await resp.json())["message"].startswith(
            f"{api.daemon.config_path}:1: "
        )
    assert api.daemon.generation == generation + 1


# --- /stats -------------------------------------------------------------------------------------


async def _connect_through_mixed(
    api: Api, port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """An HTTP CONNECT to 127.0.0.1:``port`` through honk's mixed inbound; the reply head."""
    reader, writer = await asyncio.open_connection("127.0.0.1", api.daemon.inbounds["lan"].bound.port)
    writer.write(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
    return reader, writer, await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)


async def test_stats_counts_connections_bytes_and_failed_dials_per_outbound(api):
    origin_port = yarl.URL(api.check_204).port
    assert await api.put("/proxies/Proxy", {"name": "hk-01"}) == (204, None)
    reader, writer, head = await _connect_through_mixed(api, origin_port)
    assert head.startswith(b"HTTP/1.1 200")
    writer.write(b"HEAD /generate_204 HTTP/1.1\r\nHost: origin\r\n\r\n")
    assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)).startswith(b"HTTP/1.1 204")
    status, body = await api.get("/stats")
    assert status == 200
    rows = {row["name"]: row for row in body["outbounds"]}
    assert set(rows) >= {"DIRECT", "REJECT", "hk-01", "dead"}
    hk = rows["hk-01"]
    assert (hk["totalConns"], hk["activeConns"], hk["errors"]) == (1, 1, 0)
    assert hk["upload"] > 0 and hk["download"] > 0
    assert body["tcp"]["activeFlows"] == 1
    assert body["udp"]["stagger"] == {
        "plans": 0,
        "attempts": 0,
        "wins": 0,
        "failures": 0,
        "timeouts": 0,
        "errors": 0,
        "drained": 0,
        "rejected": 0,
    }  # no cold UDP plan ran
    assert set(body["pool"]) == {"readyHits", "readyMisses", "entries"}
    assert body["warm"]["nodes"]["selector"] >= 1  # the Selectors' choices are pinned
    assert body["warm"]["preconnected"] == 0  # quiet_global turns startup preconnect off
    writer.close()
    await poll(lambda: not api.daemon.tracker.snapshot(), "the flow to end")
    status, body = await api.get("/stats")
    hk_after = {row["name"]: row for row in body["outbounds"]}["hk-01"]
    assert hk_after["activeConns"] == 0 and hk_after["upload"] >= hk["upload"]  # ended flows keep counting

    assert await api.put("/proxies/" + quote(JAPAN, safe=""), {"name": "dead"}) == (204, None)
    assert await api.put("/proxies/Proxy", {"name": JAPAN}) == (204, None)
    _, refused_writer, head = await _connect_through_mixed(api, origin_port)
    refused_writer.close()
    assert not head.startswith(b"HTTP/1.1 200")
    status, body = await api.get("/stats")
    dead = {row["name"]: row for row in body["outbounds"]}["dead"]
    assert (dead["totalConns"], dead["errors"]) == (0, 1)
