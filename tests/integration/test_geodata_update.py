"""``honkctl geodata update`` against a real ``honk run``: the files ``assets.geodata`` names come
from a local HTTP server (bytes the test built, tests/helpers/geodata.py), are swapped into
``data_dir``, and the daemon's routing decides real SOCKS5 flows by the new codes at once; a
truncated file, a file lacking a code the rules use, or a 404 is reported per file, exits 1, and
leaves both the old file and the running routing as they were. One case downloads through a
SOCKS5 node (``route: <node>``), and fails once that node is gone."""

from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from helpers.geodata import geoip_bytes, geosite_bytes
from helpers.peerservers import microsocks
from helpers.proc import HonkProcess
from helpers.servers import EchoServer
from helpers.sockets import roundtrip
from helpers.socks import socks5_connect

from honk.geo import dat

SECRET = "geo-s3cret"
SOCKS_REPLY_NOT_ALLOWED = 0x02
CTL_TIMEOUT = 60.0  # seconds a honkctl run may take (a local download and a reload)
SERVE_POLL = 0.05  # seconds between the file server's shutdown checks

OLD_SITES = {"MINE": [(dat.FULL, "not-localhost.example", ())]}
NEW_SITES = {"MINE": [(dat.FULL, "localhost", ())], "OTHER": [(dat.DOMAIN, "other.example", ())]}
OLD_IPS = {"MINE": (["192.0.2.0/24"], False)}
NEW_IPS = {"MINE": (["127.0.0.0/8"], False)}


class _Files(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        server: FileServer = self.server.files  # type: ignore[attr-defined]
        with server.lock:
            server.asked.append(self.path)
            body = server.files.get(self.path)
        if body is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


class FileServer:
    """Serves ``files`` (path -> bytes) on 127.0.0.1; any other path (a .sha256sum) is a 404."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.asked: list[str] = []
        self.lock = threading.Lock()
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Files)
        self._server.daemon_threads = True
        self._server.files = self  # type: ignore[attr-defined]
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, args=(SERVE_POLL,), daemon=True)
        self._thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def serve(self, path: str, body: bytes) -> None:
        with self.lock:
            self.files[path] = body

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def config(var: Path, files: FileServer, *, route: str = "direct", node: str = "") -> str:
    return f"""global {{
    log_level: info
    data_dir: {var}
    tcp_check_url: ''
    check_interval: 3600s
    preconnect_node_count: 0
}}
inbound {{
    lan: 'mixed://127.0.0.1:0'
}}
{node}routing {{
    domain(geosite: mine) -> direct
    dip(geoip: mine) -> direct
    fallback: block
}}
assets {{
    geodata {{
        geosite: '{files.url("/geosite.dat")}'
        geoip: '{files.url("/geoip.dat")}'
        route: {route}
    }}
}}
experimental {{
    clash_api {{
        external_controller: '127.0.0.1:0'
        secret: '{SECRET}'
    }}
}}
"""


@contextmanager
def running(
    tmp_path: Path, *, route: str = "direct", node: str = ""
) -> Iterator[tuple[HonkProcess, FileServer, Path, str]]:
    var = tmp_path / "var"
    var.mkdir()
    (var / "geosite.dat").write_bytes(geosite_bytes(OLD_SITES))
    (var / "geoip.dat").write_bytes(geoip_bytes(OLD_IPS))
    files = FileServer()
    cfg = tmp_path / "honk.dae"
    cfg.write_text(config(var, files, route=route, node=node))
    env = {k: v for k, v in os.environ.items() if k != "DAE_LOCATION_ASSET"}
    try:
        with HonkProcess(cfg, env=env) as honk:
            host, port = honk.bound("api")
            yield honk, files, var, f"http://{host}:{port}"
    finally:
        files.close()


def honkctl(api: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HONK_API", "HONK_API_SECRET", "HONK_SECRET")}
    return subprocess.run(
        [sys.executable, "-m", "honk.cli.ctl", "--api", api, "--secret", SECRET, *args],
        capture_output=True,
        text=True,
        timeout=CTL_TIMEOUT,
        env=env,
        check=False,
    )


def reaches(proxy: tuple[str, int], host: str, port: int) -> bool:
    """Whether the daemon routes a SOCKS5 CONNECT to ``host`` somewhere other than block."""
    sock, rep = socks5_connect(proxy, host, port)
    try:
        if rep == SOCKS_REPLY_NOT_ALLOWED:
            return False
        assert rep == 0 and roundtrip(sock, b"geo") == b"geo"
        return True
    finally:
        sock.close()


def test_an_update_swaps_both_files_and_new_flows_route_by_the_new_codes(tmp_path):
    with EchoServer() as echo, running(tmp_path) as (honk, files, var, api):
        proxy = honk.inbound()
        assert not reaches(proxy, "localhost", echo.port)  # the old list: fallback block
        assert not reaches(proxy, "127.0.0.1", echo.port)
        files.serve("/geosite.dat", geosite_bytes(NEW_SITES))
        files.serve("/geoip.dat", geoip_bytes(NEW_IPS))

        done = honkctl(api, "geodata", "update")
        assert done.returncode == 0, (done.stdout, done.stderr)
        lines = done.stdout.splitlines()
        site_bytes, ip_bytes = len(geosite_bytes(NEW_SITES)), len(geoip_bytes(NEW_IPS))
        assert lines[0] == f"geosite: updated ({site_bytes} bytes, 2 codes) {var / 'geosite.dat'}"
        assert lines[1] == f"geoip: updated ({ip_bytes} bytes, 1 codes) {var / 'geoip.dat'}"
        assert lines[2].startswith("reloaded: generation ")
        assert (var / "geosite.dat").read_bytes() == geosite_bytes(NEW_SITES)
        assert (var / "geoip.dat").read_bytes() == geoip_bytes(NEW_IPS)
        assert "/geosite.dat.sha256sum" in files.asked  # the checksum was looked for (404: none)
        assert reaches(proxy, "localhost", echo.port)  # geosite: mine now names it
        assert reaches(proxy, "127.0.0.1", echo.port)  # geoip: mine now holds loopback

        again = honkctl(api, "geodata", "update", "--name", "geoip")
        assert again.returncode == 0, again.stderr
        assert again.stdout.splitlines() == [f"geoip: unchanged {var / 'geoip.dat'}"]


def test_bad_downloads_keep_the_old_files_and_the_running_routing_and_exit_1(tmp_path):
    with EchoServer() as echo, running(tmp_path) as (honk, files, var, api):
        proxy = honk.inbound()
        files.serve("/geosite.dat", geosite_bytes(NEW_SITES))
        files.serve("/geoip.dat", geoip_bytes(NEW_IPS))
        assert honkctl(api, "geodata", "update").returncode == 0
        good_site, good_ip = (var / "geosite.dat").read_bytes(), (var / "geoip.dat").read_bytes()

        truncated = geosite_bytes({**NEW_SITES, "MORE": [(dat.DOMAIN, "more.example", ())]})
        files.serve("/geosite.dat", truncated[: len(truncated) - 7])
        files.serve("/geoip.dat", geoip_bytes({"CN": (["203.0.113.0/24"], False)}))  # no MINE
        bad = honkctl(api, "geodata", "update")
        assert bad.returncode == 1
        assert "geosite: failed (geosite.dat from its URL: not a geosite file" in bad.stderr
        assert f"{var / 'geosite.dat'} is kept)" in bad.stderr
        assert (
            "geoip: failed (geoip.dat from its URL: has no list 'mine', which a routing rule uses"
            in bad.stderr
        )
        assert "reloaded" not in bad.stdout

        with files.lock:
            del files.files["/geoip.dat"]
        missing = honkctl(api, "geodata", "update", "--name", "geoip")
        assert missing.returncode == 1
        assert "geoip: failed (download failed: http-status (HTTP 404))" in missing.stderr

        as_json = honkctl(api, "--json", "geodata", "update", "--name", "geoip")
        assert as_json.returncode == 1 and '"status": "failed"' in as_json.stdout

        assert (var / "geosite.dat").read_bytes() == good_site
        assert (var / "geoip.dat").read_bytes() == good_ip
        assert sorted(p.name for p in var.iterdir() if p.name.endswith(".dat")) == [
            "geoip.dat",
            "geosite.dat",
        ]
        assert not [p for p in var.iterdir() if p.name.startswith(".honk-geodata-")]  # no temporary left
        assert reaches(proxy, "localhost", echo.port)  # the routing the good files gave still runs
        assert reaches(proxy, "127.0.0.1", echo.port)


def test_a_download_through_a_node_uses_it_and_fails_once_it_is_gone(tmp_path):
    with ExitStack() as peer_running:
        peer = peer_running.enter_context(microsocks())
        node = f"node {{\n    relay: 'socks5://127.0.0.1:{peer.port}'\n}}\n"
        with running(tmp_path, route="relay", node=node) as (_honk, files, var, api):
            files.serve("/geosite.dat", geosite_bytes(NEW_SITES))
            done = honkctl(api, "geodata", "update", "--name", "geosite")
            assert done.returncode == 0, (done.stdout, done.stderr)
            assert (var / "geosite.dat").read_bytes() == geosite_bytes(NEW_SITES)
            peer_running.close()  # the node's server stops
            files.serve("/geosite.dat", geosite_bytes(OLD_SITES))
            gone = honkctl(api, "geodata", "update", "--name", "geosite")
            assert gone.returncode == 1  # a direct dial would have reached the file server
            assert "geosite: failed (download failed: dial-failed)" in gone.stderr
            assert (var / "geosite.dat").read_bytes() == geosite_bytes(NEW_SITES)
