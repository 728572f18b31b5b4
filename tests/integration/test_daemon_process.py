"""The daemon as a real process: readiness, SIGHUP reload, SIGTERM drain, the CLI."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.peers import require, require_binary
from helpers.proc import HonkProcess
from helpers.servers import EchoServer
from helpers.sockets import roundtrip
from helpers.socks import socks5_connect

REPO = Path(__file__).resolve().parents[2]
SOCKS_REPLY_NOT_ALLOWED = 0x02


def write_config(path: Path, echo_port: int, target: str, grace: str = "5s") -> None:
    path.write_text(
        "global {\n"
        "    log_level: info\n"
        "    data_dir: ./var\n"
        f"    shutdown_grace: {grace}\n"
        "}\n"
        "inbound {\n"
        "    lan: 'mixed://127.0.0.1:0'\n"
        "}\n"
        "routing {\n"
        f"    dport({echo_port}) -> {target}\n"
        "    fallback: direct\n"
        "}\n"
    )


@pytest.fixture
def echo():
    with EchoServer() as server:
        yield server


def test_sighup_reroutes_new_flows_while_established_flow_keeps_transferring(tmp_path, echo):
    cfg = tmp_path / "honk.dae"
    write_config(cfg, echo.port, "direct")
    with HonkProcess(cfg) as honk:
        proxy = honk.inbound()
        live, rep = socks5_connect(proxy, "127.0.0.1", echo.port)
        assert rep == 0
        assert roundtrip(live, b"before reload") == b"before reload"

        write_config(cfg, echo.port, "block")
        mark = honk.mark()
        honk.signal(signal.SIGHUP)
        honk.wait_for(r"config reloaded: built \[route\]", after=mark)

        # The flow opened under generation 1 keeps its upstream socket.
        assert roundtrip(live, b"x" * 100_000) == b"x" * 100_000
        # A new flow to the same target follows the new rule.
        fresh, rep = socks5_connect(proxy, "127.0.0.1", echo.port)
        assert rep == SOCKS_REPLY_NOT_ALLOWED
        fresh.close()
        assert roundtrip(live, b"still alive") == b"still alive"
        live.close()


def test_sighup_with_broken_file_changes_nothing_and_logs_the_located_error(tmp_path, echo):
    cfg = tmp_path / "honk.dae"
    write_config(cfg, echo.port, "direct")
    with HonkProcess(cfg) as honk:
        proxy = honk.inbound()
        live, rep = socks5_connect(proxy, "127.0.0.1", echo.port)
        assert rep == 0

        write_config(cfg, echo.port, "no-such-outbound")  # the rule sits on line 10
        mark = honk.mark()
        honk.signal(signal.SIGHUP)
        err = honk.wait_for(r"config error .*", after=mark).group(0)
        assert "honk.dae:10" in err and "routing.rules[0]" in err and "unknown-outbound" in err
        honk.wait_for(
            r"reload: .*honk.dae:10: routing.rules\[0\]: .*; keeping the running config", after=mark
        )

        assert roundtrip(live, b"unchanged") == b"unchanged"
        again, rep = socks5_connect(proxy, "127.0.0.1", echo.port)
        assert rep == 0, "the old rule (direct) must still route new flows"
        assert roundtrip(again, b"ok") == b"ok"
        again.close()
        live.close()
        assert honk.stop() == 0


def test_sigterm_gives_live_flows_the_grace_period_then_closes_them(tmp_path, echo):
    cfg = tmp_path / "honk.dae"
    write_config(cfg, echo.port, "direct", grace="300ms")
    with HonkProcess(cfg) as honk:
        proxy = honk.inbound()
        live, rep = socks5_connect(proxy, "127.0.0.1", echo.port)
        assert rep == 0 and roundtrip(live, b"hi") == b"hi"
        mark = honk.mark()
        honk.signal(signal.SIGTERM)
        honk.wait_for(r"draining .*live_flows=1", after=mark)
        # The listener is gone at once...
        with pytest.raises(OSError):
            socket.create_connection(proxy, timeout=2).close()
        # ...and the flow left after the grace period is closed by honk.
        live.settimeout(10)
        assert live.recv(1) == b""
        honk.wait_for(r"closed flows left after grace .*closed=1", after=mark)
        assert honk.proc.wait(15) == 0


def test_sigterm_with_no_live_flows_exits_zero_promptly(tmp_path, echo):
    cfg = tmp_path / "honk.dae"
    write_config(cfg, echo.port, "direct")
    with HonkProcess(cfg) as honk:
        honk.inbound()
        honk.signal(signal.SIGTERM)
        assert honk.proc.wait(15) == 0
        honk.wait_for(r"honk stopped")


def test_under_systemd_honk_says_ready_reloading_and_stopping_on_its_notify_socket(tmp_path, echo):
    """Type=notify: READY=1 once it serves, RELOADING=1 then READY=1 around a SIGHUP (a refused
    reload included), STOPPING=1 before the drain."""
    cfg = tmp_path / "honk.dae"
    write_config(cfg, echo.port, "direct")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(tmp_path / "notify.sock"))
        notify.settimeout(15)

        def next_message() -> dict[str, str]:
            return dict(line.split("=", 1) for line in notify.recv(4096).decode().splitlines())

        with HonkProcess(cfg, env={"NOTIFY_SOCKET": str(tmp_path / "notify.sock")}) as honk:
            ready = next_message()
            honk.inbound()  # the ready line was logged before the notification
            assert ready["READY"] == "1" and ready["STATUS"] == "serving generation 1"
            write_config(cfg, echo.port, "block")  # a changed file: a new generation
            honk.signal(signal.SIGHUP)
            reloading = next_message()
            assert reloading["RELOADING"] == "1" and int(reloading["MONOTONIC_USEC"]) > 0
            assert next_message() == {"READY": "1", "STATUS": "serving generation 2"}
            cfg.write_text("routing {\n")  # broken: refused, the old configuration keeps serving
            honk.signal(signal.SIGHUP)
            assert next_message()["RELOADING"] == "1"
            assert next_message() == {
                "READY": "1",
                "STATUS": "reload refused; serving the previous configuration",
            }
            honk.signal(signal.SIGTERM)
            assert next_message()["STOPPING"] == "1"
            assert honk.proc.wait(15) == 0


def test_demo_config_serves_on_the_documented_port():
    """`make run` runs exactly this: honk on configs/demo.toml, mixed port 7890."""
    curl = require_binary("curl")
    probe = socket.socket()
    # The same question honk's bind asks: is there a listener? (TIME_WAIT leftovers don't count.)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind(("127.0.0.1", 7890))
    except OSError:
        require(False, "port 7890 is taken on this machine; the demo config needs it")
    finally:
        probe.close()
    with EchoServer() as origin, HonkProcess(REPO / "configs" / "demo.toml") as honk:
        assert honk.inbound() == ("127.0.0.1", 7890)
        # An HTTP server is not needed to prove the port serves: a blocked name is
        # refused by honk itself with the SOCKS5 "not allowed" reply.
        out = subprocess.run(
            [
                curl,
                "-sS",
                "--max-time",
                "10",
                "--socks5-hostname",
                "127.0.0.1:7890",
                "http://www.blocked.example/",
            ],
            capture_output=True,
            text=True,
        )
        # curl reports the SOCKS5 reply code it got: 2, "connection not allowed by ruleset".
        assert out.returncode != 0 and "(2)" in out.stderr, out.stderr
        sock, rep = socks5_connect(("127.0.0.1", 7890), "127.0.0.1", origin.port)
        assert rep == 0 and roundtrip(sock, b"demo") == b"demo"
        sock.close()


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "honk.cli.daemon", *args], capture_output=True, text=True, cwd=REPO
    )


@pytest.mark.parametrize("name", ["demo.toml", "demo.dae"])
def test_honk_check_accepts_the_demo_configs_with_a_summary(name):
    out = run_cli("check", "-c", f"configs/{name}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("\n") == 1 and ": ok: 1 inbound(s)" in out.stdout


def test_honk_check_rejects_a_broken_file_with_located_errors(tmp_path):
    cfg = tmp_path / "bad.dae"
    write_config(cfg, 8080, "no-such-outbound")
    out = run_cli("check", "-c", str(cfg))
    assert out.returncode == 1
    assert "bad.dae:10" in out.stderr and "unknown-outbound" in out.stderr


def test_honkctl_help_describes_the_client():
    out = subprocess.run([sys.executable, "-m", "honk.cli.ctl", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "Inspect and steer a running honk daemon" in out.stdout


def test_start_on_a_taken_port_exits_with_the_refused_apply_and_code_1(tmp_path):
    holder = socket.create_server(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    cfg = tmp_path / "honk.dae"
    cfg.write_text(
        f"global {{\n    data_dir: ./var\n}}\ninbound {{\n    lan: 'mixed://127.0.0.1:{port}'\n}}\n"
    )
    try:
        out = run_cli("run", "-c", str(cfg))
    finally:
        holder.close()
    assert out.returncode == 1  # the first apply was refused: nothing started
    assert f"honk did not start: inbound lan: binding 127.0.0.1:{port} failed: " in out.stderr
    assert "address already in use" in out.stderr.lower()


def test_start_with_an_invalid_file_exits_with_located_errors_and_code_1(tmp_path):
    cfg = tmp_path / "honk.dae"
    write_config(cfg, 8080, "no-such-outbound")
    out = run_cli("run", "-c", str(cfg))
    assert out.returncode == 1
    assert "honk.dae:10" in out.stderr and "unknown-outbound" in out.stderr and "did not start" in out.stderr


OPEN_ROUTER = """global {
    data_dir: ./var
}
inbound {
    lan: 'mixed://0.0.0.0:7890'
}
routing {
    fallback: direct
}
experimental {
    clash_api {
        external_controller: '0.0.0.0:9090'
    }
}
"""


def test_honk_check_refuses_an_api_and_a_proxy_anyone_on_the_network_can_use(tmp_path):
    cfg = tmp_path / "open.dae"
    cfg.write_text(OPEN_ROUTER)
    out = run_cli("check", "-c", str(cfg))
    assert out.returncode == 1
    assert "open.dae:5: error: inbound.lan:" in out.stderr and "[open-proxy]" in out.stderr
    assert "open.dae:12: error: experimental.clash_api.external_controller:" in out.stderr
    assert "[open-api]" in out.stderr

    # said explicitly, both load, and check still reports them
    cfg.write_text(
        OPEN_ROUTER.replace("0.0.0.0:7890'", "0.0.0.0:7890?allow_unauthenticated=true'").replace(
            "'0.0.0.0:9090'\n", "'0.0.0.0:9090'\n        allow_unauthenticated: true\n"
        )
    )
    out = run_cli("check", "-c", str(cfg))
    assert out.returncode == 0, out.stderr
    assert "2 warning(s)" in out.stdout
    assert out.stderr.count("warning:") == 2 and "[open-api]" in out.stderr and "[open-proxy]" in out.stderr
