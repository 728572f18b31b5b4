"""A real browser on honk's Clash API from another origin (clash-api.md §1 "CORS").

A headless Chromium loads a page served by a second HTTP server (another port, so another
origin) whose script calls ``GET /version`` and ``PUT /proxies/{name}`` with a Bearer secret and
``Content-Type: application/json``, as Yacd does; that header makes every call preflighted. The
DevTools Network domain records the preflights as they crossed the wire.

Private network access: Chromium replaced the PNA preflight header
(``Access-Control-Request-Private-Network``) by the Local Network Access permission (shipped
around Chromium 142). The Chromium 156 of Debian 12 sends the header in no configuration (its
binary no longer contains it); a page from a public address reaching a private one needs the
``localNetwork`` permission (``loopbackNetwork`` for a loopback target), which headless Chromium
denies unless it is granted with ``Browser.grantPermissions``. The browser test therefore makes
the page public and the API private with ``--ip-address-space-overrides``, shows the request
denied, grants the permission and shows the calls then succeed, and checks the PNA answer on any
preflight that asks for it. honk's answer to the header itself, which Chromium builds from before
Local Network Access send, is pinned by a raw preflight from aiohttp.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web
from helpers.aio import STEP, close_writer, socks5_open
from helpers.apidaemon import LAN_INBOUND, api_base, api_block, api_port, quiet_global, running_daemon
from helpers.browser import Browser, Page, leftovers
from helpers.dns import DnsResponder
from helpers.origins import generate_204
from helpers.peers import require_binary
from helpers.peerservers import ss_server
from helpers.servers import echo_server, free_port

from honk.core.net import Network

SECRET = "s3cret"
GROUP = "My Proxy"  # a space in the name: the page sends it percent-encoded, as metacubexd does
GROUP_PATH = "/proxies/" + quote(GROUP, safe="")  # what encodeURIComponent makes of it
PUBLIC_DASHBOARD = "https://metacubex.github.io"  # a public dashboard origin (clash-api.md §1)

CONFIG = (
    quiet_global()
    + LAN_INBOUND
    + f"""node {{
    a: 'socks5://127.0.0.1:9'
    b: 'socks5://127.0.0.1:19'
}}
group {{
    {GROUP} {{
        filter: name(a, b)
        policy: fixed(0)
    }}
}}
routing {{
    fallback: '{GROUP}'
}}
"""
    + api_block(SECRET)
)

# The dashboard page: every call goes through call(), which reports what the page could read
# (status and JSON body) or the error fetch threw (a CORS or network refusal).
PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>dashboard</title><script>
const API = "%(api)s";
async function call(method, path, secret, body) {
  try {
    const response = await fetch(API + path, {
      method,
      headers: {"Authorization": "Bearer " + secret, "Content-Type": "application/json"},
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await response.text();
    return {status: response.status, body: text ? JSON.parse(text) : null};
  } catch (error) {
    return {error: String(error)};
  }
}
// A stream the way a dashboard falls back to it: a fetch whose first line is read, then dropped.
async function stream(path, secret) {
  const controller = new AbortController();
  try {
    const response = await fetch(API + path, {headers: {"Authorization": "Bearer " + secret},
                                               signal: controller.signal});
    const reader = response.body.getReader();
    let text = "";
    while (!text.includes("\\n")) {
      const chunk = await reader.read();
      if (chunk.done) break;
      text += new TextDecoder().decode(chunk.value);
    }
    return {status: response.status, body: JSON.parse(text.split("\\n")[0])};
  } catch (error) {
    return {error: String(error)};
  } finally {
    controller.abort();
  }
}
// A stream the way metacubexd opens it: a WebSocket with ?token=, its first message.
const sockets = {};
function socket(path, secret) {
  const sep = path.includes("?") ? "&" : "?";
  const url = API.replace(/^http/, "ws") + path + sep + "token=" + encodeURIComponent(secret);
  sockets[path] = new Promise((resolve) => {
    const ws = new WebSocket(url);
    ws.onmessage = (event) => { ws.close(); resolve({body: JSON.parse(event.data)}); };
    ws.onerror = () => resolve({error: "websocket error"});
    ws.onclose = (event) => resolve({error: "closed " + event.code});
  });
  return true;
}
const version = (secret) => call("GET", "/version", secret);
const select = (group, member, secret) =>
  call("PUT", "/proxies/" + encodeURIComponent(group), secret, {name: member});
</script></head><body>dashboard</body></html>
"""


# --- fixtures ---------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def dashboard_origin(api_port: int) -> AsyncIterator[int]:
    """The page on its own port of 127.0.0.1: a different origin from the API."""
    html = PAGE % {"api": f"http://127.0.0.1:{api_port}"}

    async def index(request: web.Request) -> web.Response:
        return web.Response(text=html, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", index)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    try:
        await web.SockSite(runner, sock).start()
        yield sock.getsockname()[1]
    finally:
        await runner.cleanup()
        sock.close()


@pytest.fixture
def browser_dir(tmp_path: Path):
    """Where the browser keeps its profile and log; no process of it may outlive the test."""
    workdir = tmp_path / "browser"
    try:
        yield workdir
    finally:
        assert leftovers(workdir) == [], "chromium processes left behind"


# --- what the browser saw ---------------------------------------------------------------------


def lower(headers: dict[str, str]) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


async def preflight(page: Page, url: str, method: str, since: int = 0) -> dict[str, Any]:
    """The first OPTIONS preflight the page sent for ``method url`` after ``since``: request and
    response headers as they crossed the wire, the status, and the address spaces Chromium assigned."""
    sent = await page.wait_event(
        "Network.requestWillBeSent",
        lambda p: (
            p["request"]["method"] == "OPTIONS"
            and p["request"]["url"] == url
            and p["request"]["headers"].get("Access-Control-Request-Method") == method
        ),
        since=since,
    )
    ident = sent["requestId"]
    request = await page.wait_event(
        "Network.requestWillBeSentExtraInfo", lambda p: p["requestId"] == ident, since=since
    )
    response = await page.wait_event(
        "Network.responseReceivedExtraInfo", lambda p: p["requestId"] == ident, since=since
    )
    return {
        "request": lower(request["headers"]),
        "response": lower(response["headers"]),
        "status": response["statusCode"],
        "initiator_space": request.get("clientSecurityState", {}).get("initiatorIPAddressSpace"),
        "target_space": response.get("resourceIPAddressSpace"),
    }


def assert_cors_preflight(seen: dict[str, Any], method: str) -> None:
    assert seen["status"] == 204
    assert "authorization" not in seen["request"]  # preflights carry no token, so CORS runs before auth
    assert seen["request"]["access-control-request-method"] == method
    assert set(seen["request"]["access-control-request-headers"].split(",")) == {
        "authorization",
        "content-type",
    }
    assert seen["response"]["access-control-allow-origin"] == "*"
    assert method in seen["response"]["access-control-allow-methods"].replace(" ", "").split(",")
    allowed = {h.strip().lower() for h in seen["response"]["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type"} <= allowed
    if seen["request"].get("access-control-request-private-network") == "true":  # a PNA-era browser
        assert seen["response"]["access-control-allow-private-network"] == "true"


# --- tests ------------------------------------------------------------------------------------


@pytest.mark.peer
async def test_a_page_from_another_origin_reads_the_version_and_switches_a_selector(tmp_path, browser_dir):
    async with running_daemon(tmp_path, CONFIG) as daemon, dashboard_origin(api_port(daemon)) as page_port:
        api = api_base(daemon)
        async with Browser.launch(browser_dir) as browser:
            page = await browser.new_page()
            await page.send("Network.enable")
            await page.navigate(f"http://127.0.0.1:{page_port}/")

            version = await page.evaluate(f"version({json.dumps(SECRET)})")
            assert version.get("status") == 200, version
            assert version["body"]["meta"] is True
            assert version["body"]["version"].startswith("honk ")
            assert_cors_preflight(await preflight(page, f"{api}/version", "GET"), "GET")

            assert daemon.plane.groups.choices().get(GROUP, {}).get(Network.TCP) != "b"
            put = await page.evaluate(f"select({json.dumps(GROUP)}, 'b', {json.dumps(SECRET)})")
            assert put == {"status": 204, "body": None}
            assert_cors_preflight(await preflight(page, f"{api}{GROUP_PATH}", "PUT"), "PUT")
            assert daemon.plane.groups.choices()[GROUP] == {Network.TCP: "b", Network.UDP: "b"}

            # the 401 carries the allow-origin header, so the page can tell a wrong secret apart
            # from an unreachable router
            refused = await page.evaluate("version('wrong')")
            assert refused == {"status": 401, "body": {"message": "Unauthorized"}}
            refused = await page.evaluate(f"select({json.dumps(GROUP)}, 'a', 'wrong')")
            assert refused == {"status": 401, "body": {"message": "Unauthorized"}}
            assert daemon.plane.groups.choices()[GROUP][Network.TCP] == "b"


@pytest.mark.peer
async def test_a_public_page_reaches_the_private_api_once_local_network_access_is_granted(
    tmp_path, browser_dir
):
    async with running_daemon(tmp_path, CONFIG) as daemon, dashboard_origin(api_port(daemon)) as page_port:
        api = api_base(daemon)
        page_origin = f"http://127.0.0.1:{page_port}"
        # the page counts as the public internet, the API as the router's LAN
        spaces = f"127.0.0.1:{page_port}=public,127.0.0.1:{api_port(daemon)}=local"
        async with Browser.launch(browser_dir, f"--ip-address-space-overrides={spaces}") as browser:
            page = await browser.new_page()
            await page.send("Network.enable")
            await page.navigate(page_origin + "/")

            # without the permission Chromium refuses before anything reaches honk: proof that
            # the override put the page and the API in different address spaces
            since = page.mark()
            denied = await page.evaluate(f"version({json.dumps(SECRET)})")
            assert "error" in denied, denied
            failed = await page.wait_event(
                "Network.loadingFailed", lambda p: "corsErrorStatus" in p, since=since
            )
            assert failed.get("corsErrorStatus", {}).get("corsError") == "LocalNetworkAccessPermissionDenied"

            await browser.send("Browser.grantPermissions", permissions=["localNetwork"], origin=page_origin)
            since = page.mark()
            version = await page.evaluate(f"version({json.dumps(SECRET)})")
            assert version.get("status") == 200, version
            assert version["body"]["meta"] is True
            seen = await preflight(page, f"{api}/version", "GET", since)
            assert (seen["initiator_space"], seen["target_space"]) == ("Public", "Local")
            assert_cors_preflight(seen, "GET")

            put = await page.evaluate(f"select({json.dumps(GROUP)}, 'b', {json.dumps(SECRET)})")
            assert put == {"status": 204, "body": None}
            assert_cors_preflight(await preflight(page, f"{api}{GROUP_PATH}", "PUT"), "PUT")
            assert daemon.plane.groups.choices()[GROUP] == {Network.TCP: "b", Network.UDP: "b"}


async def test_a_private_network_preflight_is_answered_without_a_token(tmp_path):
    """What PNA-era Chromium sends from a public dashboard to a LAN router, sent raw."""
    async with running_daemon(tmp_path, CONFIG) as daemon, aiohttp.ClientSession() as client:
        url = api_base(daemon) + GROUP_PATH
        asks = {
            "Origin": PUBLIC_DASHBOARD,
            "Access-Control-Request-Method": "PUT",
            "Access-Control-Request-Headers": "authorization,content-type",
        }
        async with client.options(
            url, headers={**asks, "Access-Control-Request-Private-Network": "true"}
        ) as r:
            assert r.status == 204
            assert r.headers["Access-Control-Allow-Private-Network"] == "true"
            assert r.headers["Access-Control-Allow-Origin"] == "*"
            assert "PUT" in r.headers["Access-Control-Allow-Methods"]
        async with client.options(url, headers=asks) as r:
            assert r.status == 204
            assert "Access-Control-Allow-Private-Network" not in r.headers  # only when asked
        assert (
            daemon.plane.groups.choices().get(GROUP, {}).get(Network.TCP) != "b"
        )  # a preflight writes nothing


# --- a hosted dashboard's whole session -------------------------------------------------------

JAPAN = "🇯🇵 日本"
SS_METHOD, SS_PASSWORD = "chacha20-ietf-poly1305", "dashboard-pass"

# Three nodes (one dead), a Selector, a URLTest and a group named in Japanese, as the issue's
# dashboard saw them; the rule before the fallback is the one the page disables.
DASHBOARD_CONFIG = """node {{
    hk-01: 'ss://{userinfo}@127.0.0.1:{ss_port}'
    hk-02: 'ss://{userinfo}@127.0.0.1:{ss_port2}'
    dead: 'socks5://127.0.0.1:{closed_port}'
}}
group {{
    Proxy {{
        filter: name(hk-01, hk-02, dead)
        filter: group(Auto, {japan})
    }}
    Auto {{
        filter: name(hk-01, hk-02, dead)
        policy: min_moving_avg
    }}
    {japan} {{
        filter: name(hk-02, dead)
        policy: fallback
    }}
}}
routing {{
    dport(22) -> direct
    fallback: Proxy
}}
dns {{
    upstream {{
        default: 'udp://127.0.0.1:{dns_port}'
    }}
}}
"""
DNS_NAME, DNS_ADDRESS = "router.example.test", "10.9.8.7"

# What metacubexd and zashboard call, from their sources (api client and WebSocket composables):
# the reads of the Overview, Proxies, Rules and Connections pages, their actions, and the four
# live streams, each over a WebSocket with ?token= and over a chunked fetch.
READS = (
    "/version",
    "/configs",
    "/proxies",
    "/providers/proxies",
    "/rules",
    "/connections",
    "/providers/rules",
    "/group",
)
STREAMS = ("/traffic", "/memory", "/connections", "/logs?level=info")


@pytest.mark.peer
async def test_a_hosted_dashboard_reads_and_drives_everything_from_another_origin(tmp_path, browser_dir):
    require_binary("ss-server")
    userinfo = base64.urlsafe_b64encode(f"{SS_METHOD}:{SS_PASSWORD}".encode()).decode().rstrip("=")
    with (
        ss_server(SS_METHOD, SS_PASSWORD, udp=False) as peer,
        ss_server(SS_METHOD, SS_PASSWORD, udp=False) as peer2,
    ):
        async with contextlib.AsyncExitStack() as stack:
            check = await stack.enter_async_context(generate_204())
            target = await stack.enter_async_context(echo_server())
            responder = stack.enter_context(DnsResponder({DNS_NAME: DNS_ADDRESS}))
            config = (
                quiet_global()
                + LAN_INBOUND
                + DASHBOARD_CONFIG.format(
                    userinfo=userinfo,
                    ss_port=peer.port,
                    ss_port2=peer2.port,
                    closed_port=free_port(),
                    japan=JAPAN,
                    dns_port=responder.port,
                )
                + api_block(SECRET)
            )
            daemon = await stack.enter_async_context(running_daemon(tmp_path, config))
            page_port = await stack.enter_async_context(dashboard_origin(api_port(daemon)))
            browser = await stack.enter_async_context(Browser.launch(browser_dir))
            page = await browser.new_page()
            await page.send("Network.enable")
            await page.navigate(f"http://127.0.0.1:{page_port}/")
            secret = json.dumps(SECRET)
            check_url = quote(f"http://127.0.0.1:{check.port}/generate_204", safe="")

            async def call(method: str, path: str, body: Any = None) -> dict[str, Any]:
                sent = "undefined" if body is None else json.dumps(body)
                seen = await page.evaluate(
                    f"call({json.dumps(method)}, {json.dumps(path)}, {secret}, {sent})"
                )
                assert "error" not in seen, (method, path, seen)  # a CORS refusal throws in fetch
                return seen

            # a live proxied flow, so the Connections page has a row to close
            reader, writer, code, _ = await socks5_open(
                daemon.inbounds["lan"].bound.port, "127.0.0.1", target
            )
            assert code == 0
            writer.write(b"ping")
            assert await asyncio.wait_for(reader.readexactly(4), STEP) == b"ping"

            for path in READS:
                seen = await call("GET", path)
                assert seen["status"] == 200, (path, seen)
            proxies = (await call("GET", "/proxies"))["body"]["proxies"]
            assert {"Proxy", "Auto", JAPAN, "hk-01", "hk-02", "dead", "GLOBAL"} <= set(proxies)
            assert len((await call("GET", "/providers/proxies"))["body"]["providers"]) >= 1

            # delay tests: a node, a dead node, a group (its members fan out), a provider
            node = await call("GET", f"/proxies/hk-01/delay?url={check_url}&timeout=2000")
            assert node["status"] == 200 and node["body"]["delay"] >= 0, node
            dead = await call("GET", f"/proxies/dead/delay?url={check_url}&timeout=2000")
            assert dead["status"] in (503, 504), dead
            group = await call("GET", f"/group/{quote(JAPAN, safe='')}/delay?url={check_url}&timeout=2000")
            assert group["status"] == 200 and set(group["body"]) == {"hk-02"}, group
            assert (await call("GET", "/providers/proxies/default/healthcheck"))["status"] in (200, 204)

            # the proxies are now known dead or alive, as the group headers count them
            proxies = (await call("GET", "/proxies"))["body"]["proxies"]
            assert proxies["dead"]["alive"] is False
            assert proxies["hk-01"]["alive"] is True

            # actions: pick, pin and unpin, mode switch and back, a rule off and on
            assert (await call("PUT", "/proxies/Proxy", {"name": "hk-02"}))["status"] == 204
            assert (await call("PUT", "/proxies/Auto", {"name": "hk-01"}))["status"] == 204
            assert (await call("DELETE", "/proxies/Auto"))["status"] == 204
            assert (await call("PATCH", "/configs", {"mode": "global"}))["status"] == 204
            assert (await call("GET", "/configs"))["body"]["mode"] == "global"
            assert (await call("PATCH", "/configs", {"mode": "rule"}))["status"] == 204
            assert (await call("PATCH", "/rules/disable", {"0": True}))["status"] == 204
            rules = (await call("GET", "/rules"))["body"]["rules"]
            assert rules[0]["extra"]["disabled"] is True
            assert (await call("PATCH", "/rules/disable", {"0": False}))["status"] == 204

            # zashboard's further tools: the DNS query and cache flush, a provider refresh, a reload
            answer = await call("GET", f"/dns/query?name={DNS_NAME}&type=A")
            assert answer["status"] == 200 and answer["body"]["Answer"][0]["data"] == DNS_ADDRESS, answer
            assert (await call("POST", "/cache/dns/flush"))["status"] == 204
            assert (await call("PUT", "/providers/proxies/default"))["status"] in (200, 204)
            assert (await call("PUT", "/configs?reload=true", {"path": "", "payload": ""}))["status"] == 204

            # live streams, both ways a dashboard opens them
            for path in STREAMS:
                await page.evaluate(f"socket({json.dumps(path)}, {secret})")
            for path in STREAMS:
                if path.startswith("/logs"):
                    continue
                chunked = await page.evaluate(f"stream({json.dumps(path)}, {secret})")
                assert chunked.get("status") == 200, (path, chunked)
            # a log line for the logs stream to carry: a flow opened now is logged at info
            reader2, writer2, code, _ = await socks5_open(
                daemon.inbounds["lan"].bound.port, "127.0.0.1", target
            )
            assert code == 0
            for path in STREAMS:
                first = await page.evaluate(f"sockets[{json.dumps(path)}]")
                assert "body" in first, (path, first)
            assert set(first["body"]) >= {"type", "payload"}
            await close_writer(writer2)

            # the Connections page closes the flow by its id, then everything
            flows = (await call("GET", "/connections"))["body"]["connections"]
            assert flows, "the proxied flow is listed"
            assert (await call("DELETE", f"/connections/{flows[0]['id']}"))["status"] == 204
            assert await asyncio.wait_for(reader.read(), STEP) == b""  # honk ended it
            assert (await call("DELETE", "/connections"))["status"] == 204
            await close_writer(writer)

            assert (await page.evaluate("stream('/traffic', 'wrong')")).get("status") == 401
            blocked = [p for m, p in page.events if m == "Network.loadingFailed" and "corsErrorStatus" in p]
            assert blocked == [], blocked


PROBE_WAIT = 15.0  # seconds the startup health checks may take to judge two nodes
POLL_EVERY = 0.1  # seconds between readings of /proxies
PROBED_CONFIG = """global {{
    data_dir: ./var
    tcp_check_url: 'http://127.0.0.1:{check_port}/generate_204'
    check_interval: 30s
    preconnect_node_count: 0
}}
node {{
    hk-01: 'ss://{userinfo}@127.0.0.1:{ss_port}'
    dead: 'socks5://127.0.0.1:{closed_port}'
}}
group {{
    {japan} {{
        filter: name(hk-01, dead)
    }}
}}
routing {{
    fallback: '{japan}'
}}
"""


@pytest.mark.peer
async def test_a_probed_dead_node_is_not_counted_among_its_groups_alive_members(tmp_path):
    """What a dashboard's group header counts (members whose ``alive`` is true), read across
    origins as metacubexd reads it, once the health checks ran: 1 of 2, not 2 of 2."""
    require_binary("ss-server")
    userinfo = base64.urlsafe_b64encode(f"{SS_METHOD}:{SS_PASSWORD}".encode()).decode().rstrip("=")
    with ss_server(SS_METHOD, SS_PASSWORD, udp=False) as peer:
        async with contextlib.AsyncExitStack() as stack:
            check = await stack.enter_async_context(generate_204())
            config = PROBED_CONFIG.format(
                check_port=check.port,
                userinfo=userinfo,
                ss_port=peer.port,
                closed_port=free_port(),
                japan=JAPAN,
            ) + api_block(SECRET)
            daemon = await stack.enter_async_context(running_daemon(tmp_path, config))
            client = await stack.enter_async_context(
                aiohttp.ClientSession(
                    headers={"Authorization": f"Bearer {SECRET}", "Origin": PUBLIC_DASHBOARD}
                )
            )

            async def proxies() -> dict[str, Any]:
                async with client.get(api_base(daemon) + "/proxies") as response:
                    assert response.headers["Access-Control-Allow-Origin"] == "*"
                    return (await response.json())["proxies"]

            deadline = asyncio.get_running_loop().time() + PROBE_WAIT
            while True:  # the startup health checks judge both nodes
                listed = await proxies()
                if listed["dead"]["alive"] is False and listed["hk-01"]["alive"] is True:
                    break
                assert asyncio.get_running_loop().time() < deadline, {
                    n: (listed[n]["alive"], listed[n]["extra"]) for n in ("dead", "hk-01")
                }
                await asyncio.sleep(POLL_EVERY)
            members = listed[JAPAN]["all"]
            assert [name for name in members if listed[name]["alive"] is True] == ["hk-01"]
