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
from helpers.apidaemon import LAN_INBOUND, api_base, api_block, api_port, quiet_global, running_daemon
from helpers.browser import Browser, Page, leftovers

from honk.core.net import Network

SECRET = "s3cret"
GROUP = "My Proxy"  # a space in the name: the page sends it percent-encoded, as metacubexd does
GROUP_PATH = "/proxies/" + quote(GROUP, safe="")  # what encodeURIComponent makes of it
PUBLIC_DASHBOARD = "https://metacubex.github.io"  # a public dashboard origin (clash-api.md §1)

CONFIG = quiet_global() + LAN_INBOUND + f"""node {{
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
""" + api_block(SECRET)

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
        lambda p: p["request"]["method"] == "OPTIONS" and p["request"]["url"] == url
        and p["request"]["headers"].get("Access-Control-Request-Method") == method,
        since=since,
    )
    ident = sent["requestId"]
    request = await page.wait_event("Network.requestWillBeSentExtraInfo", lambda p: p["requestId"] == ident,
                                    since=since)
    response = await page.wait_event("Network.responseReceivedExtraInfo", lambda p: p["requestId"] == ident,
                                     since=since)
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
    assert set(seen["request"]["access-control-request-headers"].split(",")) == {"authorization", "content-type"}
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
        tmp_path, browser_dir):
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
            failed = await page.wait_event("Network.loadingFailed", lambda p: "corsErrorStatus" in p, since=since)
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
        async with client.options(url, headers={**asks, "Access-Control-Request-Private-Network": "true"}) as r:
            assert r.status == 204
            assert r.headers["Access-Control-Allow-Private-Network"] == "true"
            assert r.headers["Access-Control-Allow-Origin"] == "*"
            assert "PUT" in r.headers["Access-Control-Allow-Methods"]
        async with client.options(url, headers=asks) as r:
            assert r.status == 204
            assert "Access-Control-Allow-Private-Network" not in r.headers  # only when asked
        assert daemon.plane.groups.choices().get(GROUP, {}).get(Network.TCP) != "b"  # a preflight writes nothing
