"""honk intercepting the host's own traffic: ``honk run`` in the router namespace of the
client → router → server test bed with only ``global.wan_interface`` set. A process in the
router namespace reaches the server through honk (TCP and UDP, IPv4 and IPv6; block rules and
``pname`` rules decide), honk's own dials leave by their mark instead of coming back to its
listener (the bypass mark, or a rule's ``direct(mark: N)``, seen by an nft counter of the test's
own), and stopping removes every rule and route it added."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.proc import HonkProcess
from helpers.testbed import CALL_TIMEOUT, ROUTER_WAN, SERVER, Testbed, testbed
from test_router_netns import kernel_state

TPROXY_PORT = 7893
HTTP_PORT = 80
BLOCKED_PORT = 8081  # the server answers there too; a rule blocks it
TLS_PORT = 443  # blocked for curl only, by process name
MARKED_PORT = 8082  # a rule dials it direct with its own socket mark
RULE_MARK = 0x800
ECHO_PORT = 5353
MARKED_ECHO_PORT = 5354  # UDP the marked rule sends direct
STOP_TIMEOUT = 15.0
CURL_MAX_TIME = 5


# the test's own table: counts packets to the marked port that leave with the rule's mark
MARK_COUNTER = f"""table inet marks {{
    chain out {{
        type filter hook output priority 0; policy accept;
        meta mark {RULE_MARK:#x} tcp dport {MARKED_PORT} counter
        meta mark {RULE_MARK:#x} udp dport {MARKED_ECHO_PORT} counter
    }}
}}
"""


def wan_config(wan: str, data_dir: Path) -> str:
    return f"""global {{
    data_dir: {data_dir}
    wan_interface: {wan}
    tproxy_port: {TPROXY_PORT}
    tcp_check_url: ''
    check_interval: 3600s
    dial_mode: ip
    log_level: debug
}}
routing {{
    dport({BLOCKED_PORT}) -> block
    pname(curl) && dport({TLS_PORT}) -> block
    dport({MARKED_PORT}, {MARKED_ECHO_PORT}) -> direct(mark: {RULE_MARK:#x})
    dip({SERVER.v6}) && l4proto(udp) -> block
    fallback: direct
}}
"""


@pytest.fixture
def bed() -> Iterator[Testbed]:
    with testbed("the wan_interface tests", "nft", "curl") as bed:
        bed.spawn(
            bed.server,
            "helpers.testbed:serve",
            f"{HTTP_PORT},{BLOCKED_PORT},{TLS_PORT},{MARKED_PORT}",
            f"{ECHO_PORT},{MARKED_ECHO_PORT}",
        )
        yield bed


def router_curl(bed: Testbed, url: str) -> subprocess.CompletedProcess[str]:
    """curl run by the router itself (its process name is ``curl``)."""
    curl = shutil.which("curl")
    assert curl is not None
    return subprocess.run(
        ["ip", "netns", "exec", bed.router, curl, "-sS", "--max-time", str(CURL_MAX_TIME), url],
        capture_output=True,
        text=True,
        timeout=CURL_MAX_TIME + CALL_TIMEOUT,
        env={"PATH": "/usr/bin:/bin"},
    )


def url(family: str, port: int) -> str:
    host = SERVER.v4 if family == "v4" else f"[{SERVER.v6}]"
    return f"http://{host}:{port}/"


def test_the_hosts_own_traffic_goes_through_honk_and_nothing_of_honks_stays_after_stop(bed, tmp_path):
    before = kernel_state(bed)
    path = tmp_path / "router.dae"
    path.write_text(wan_config(bed.wan, tmp_path))
    # without honk the router reaches every port: what changes below is honk's doing
    assert router_curl(bed, url("v4", BLOCKED_PORT)).stdout == f"hello from server, peer={ROUTER_WAN.v4}"

    with HonkProcess(path, netns=bed.router) as honk:
        honk.wait_for(rf"interception installed lan= tproxy_port={TPROXY_PORT} wan={bed.wan}")
        honk.wait_for(r"honk ready")
        assert "chain output" in bed.exec(bed.router, "nft", "list", "table", "inet", "honk").stdout
        for family in ("v4", "v6"):
            peer = getattr(ROUTER_WAN, family)
            mark = honk.mark()
            # honk dials the server itself; its own socket is not diverted back to it (no loop)
            assert router_curl(bed, url(family, HTTP_PORT)).stdout == f"hello from server, peer={peer}"
            honk.wait_for(r"flow opened network=tcp inbound=tproxy .*rule=fallback chain=direct", after=mark)
            refused = router_curl(bed, url(family, BLOCKED_PORT))
            assert refused.returncode != 0 and "hello" not in refused.stdout
            honk.wait_for(rf"flow refused inbound=tproxy .*:{BLOCKED_PORT} error=Blocked", after=mark)

            # pname: curl is refused on the TLS port, another process is not
            mark = honk.mark()
            assert router_curl(bed, url(family, TLS_PORT)).returncode != 0
            honk.wait_for(rf"flow refused inbound=tproxy .*:{TLS_PORT} error=Blocked", after=mark)
            hello = bed.call(
                bed.router, "helpers.testbed:tls_hello", getattr(SERVER, family), str(TLS_PORT), "fine.test"
            )
            assert hello.strip() == f"reply:hello from server, peer={peer}"

        # `-> direct(mark: 0x800)`: honk's dial of that port carries the rule's mark
        bed.exec(bed.router, "nft", "-f", "-", input=MARK_COUNTER)
        assert router_curl(bed, url("v4", MARKED_PORT)).stdout == f"hello from server, peer={ROUTER_WAN.v4}"
        marked_udp = bed.call(
            bed.router, "helpers.testbed:udp_exchange", SERVER.v4, str(MARKED_ECHO_PORT), "m"
        )
        assert json.loads(marked_udp)["reply"] == f"echo:m seen-from={ROUTER_WAN.v4}"
        counted = bed.exec(bed.router, "nft", "list", "chain", "inet", "marks", "out").stdout
        assert len(re.findall(r"counter packets [1-9]", counted)) == 2, counted  # TCP and UDP
        bed.exec(bed.router, "nft", "delete", "table", "inet", "marks")

        replies = [
            json.loads(line)
            for line in bed.call(
                bed.router, "helpers.testbed:udp_exchange", SERVER.v4, str(ECHO_PORT), "ping"
            ).splitlines()
        ]
        assert replies == [
            {"reply": f"echo:ping seen-from={ROUTER_WAN.v4}", "source": [SERVER.v4, ECHO_PORT]}
        ]
        blocked = [
            json.loads(line)
            for line in bed.call(
                bed.router, "helpers.testbed:udp_exchange", SERVER.v6, str(ECHO_PORT), "ping"
            ).splitlines()
        ]
        assert "error" in blocked[0]  # diverted to honk, which blocks IPv6 UDP to the server
        assert honk.stop(STOP_TIMEOUT) == 0

    assert kernel_state(bed) == before
    assert router_curl(bed, url("v4", BLOCKED_PORT)).stdout == f"hello from server, peer={ROUTER_WAN.v4}"


def test_wan_auto_follows_the_default_route_as_it_comes_and_goes(bed, tmp_path):
    path = tmp_path / "router.dae"
    path.write_text(wan_config("auto", tmp_path))
    with HonkProcess(path, netns=bed.router) as honk:
        honk.wait_for(r"interception pending: no interface yet")  # the bed's router has no default route
        honk.wait_for(r"honk ready")
        assert router_curl(bed, url("v4", BLOCKED_PORT)).stdout.startswith(
            "hello from server"
        )  # not diverted
        mark = honk.mark()
        bed.exec(bed.router, "ip", "route", "add", "default", "via", SERVER.v4, "dev", bed.wan)
        honk.wait_for(rf"interception installed lan= tproxy_port={TPROXY_PORT} wan={bed.wan}", after=mark)
        refused = router_curl(bed, url("v4", BLOCKED_PORT))
        assert refused.returncode != 0 and "hello" not in refused.stdout  # now through honk
        mark = honk.mark()
        bed.exec(bed.router, "ip", "route", "del", "default")
        honk.wait_for(r"interception pending: no interface yet", after=mark)
        assert router_curl(bed, url("v4", BLOCKED_PORT)).stdout.startswith("hello from server")
        assert honk.stop(STOP_TIMEOUT) == 0
