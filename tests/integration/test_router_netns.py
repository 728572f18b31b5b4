"""honk as the router: ``honk run`` in the router namespace of a client → router → server test
bed, configured only with ``global.lan_interface``. The daemon installs its own interception
(nftables table, policy routing), serves the transparent listener, answers the LAN's
intercepted DNS through its DNS module (learning names for later IP flows), routes by rule
and by sniffed name, and on stop leaves the namespace's ruleset, rules, routes and tc filters
as it found them; after a SIGKILL a restart replaces what the dead run left and works."""

from __future__ import annotations

import json
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers.dns import build_query, build_response, parse_answer
from helpers.proc import HonkProcess
from helpers.testbed import PEER_TIMEOUT, ROUTER_WAN, SERVER, Testbed, announce_ready, testbed

TPROXY_PORT = 7893
HTTP_PORT = 80
BLOCKED_PORT = 8081  # the server answers there too; a rule blocks it
TLS_PORT = 443
ECHO_PORT = 5353
STOP_TIMEOUT = 15.0
DNS_PORT = 53
# DNS servers the LAN asks that do not exist: only honk can answer
NOWHERE = {"v4": "198.51.100.53", "v6": "2001:db8:2::53"}
DNS_RECORDS = {"blocked.test": SERVER.v4, "fine.test": SERVER.v4}
DNS_SECTION = f"dns {{\n    upstream {{\n        default: 'udp://{SERVER.v4}:{DNS_PORT}'\n    }}\n}}\n"


def router_config(lan: str, data_dir: Path, *, dial_mode: str = "domain++", extra: str = "") -> str:
    return f"""global {{
    data_dir: {data_dir}
    lan_interface: {lan}
    tproxy_port: {TPROXY_PORT}
    tcp_check_url: ''
    check_interval: 3600s
    dial_mode: {dial_mode}
    auto_config_kernel_parameter: true
}}
{extra}
routing {{
    domain(suffix: blocked.test) -> block
    dport({BLOCKED_PORT}) -> block
    fallback: direct
}}
"""


# --- peers for the namespaces ------------------------------------------------------------------


def dns_serve(records: str) -> None:
    """The server namespace's DNS server on UDP port 53 (both families): A records from the
    JSON ``records``, NXDOMAIN otherwise; prints ``asked <name> from <address>`` per query."""
    table = json.loads(records)
    sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(("::", DNS_PORT))
    announce_ready()
    while True:
        query, peer = sock.recvfrom(4096)
        reply = build_response(query, {name: [ip] for name, ip in table.items()})
        if reply is not None:
            print(f"asked from {peer[0].removeprefix('::ffff:')}", flush=True)
            sock.sendto(reply, peer)


def dns_ask(server: str, name: str) -> None:
    """The client's query: prints ``{"ips": [...], "source": [host, port]}``."""
    with socket.socket(socket.AF_INET6 if ":" in server else socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(PEER_TIMEOUT)
        sock.sendto(build_query(name, 0x4242), (server, DNS_PORT))
        reply, source = sock.recvfrom(4096)
    qid, rcode, ips = parse_answer(reply)
    print(json.dumps({"qid": qid, "rcode": rcode, "ips": ips, "source": list(source[:2])}))


@pytest.fixture
def bed() -> Iterator[Testbed]:
    with testbed("the router tests", "nft", "curl", "tc") as bed:
        bed.spawn(
            bed.server, "helpers.testbed:serve", f"{HTTP_PORT},{BLOCKED_PORT},{TLS_PORT}", str(ECHO_PORT)
        )
        yield bed


def kernel_state(bed: Testbed) -> str:
    """Everything of the router namespace honk may touch: nft, ip rules and routes, tc filters."""
    parts = [bed.exec(bed.router, "nft", "list", "ruleset").stdout]
    for args in (
        ["-4", "rule"],
        ["-6", "rule"],
        ["-4", "route", "show", "table", "all"],
        ["-6", "route", "show", "table", "all"],
    ):
        lines = bed.exec(bed.router, "ip", *args).stdout.splitlines()
        # the kernel's own routes (link-local addresses still appearing on new links) are not honk's
        parts.append("\n".join(line for line in lines if "proto kernel" not in line))
    parts.append(bed.exec(bed.router, "tc", "filter", "show", "dev", bed.lan, "ingress", check=False).stdout)
    return "\n".join(parts)


def start_honk(bed: Testbed, tmp_path: Path, **config: str) -> HonkProcess:
    path = tmp_path / "router.dae"
    path.write_text(router_config(bed.lan, tmp_path, **config))
    honk = HonkProcess(path, netns=bed.router)
    honk.wait_for(r"honk ready")
    return honk


def udp_replies(bed: Testbed, host: str, *payloads: str) -> list[dict]:
    out = bed.call(bed.client, "helpers.testbed:udp_exchange", host, str(ECHO_PORT), *payloads)
    return [json.loads(line) for line in out.splitlines()]


@pytest.mark.parametrize("family", ["v4", "v6"])
def test_lan_traffic_is_proxied_by_the_daemon_and_a_block_rule_refuses(bed, tmp_path, family):
    server = getattr(SERVER, family)
    url_host = f"[{server}]" if family == "v6" else server
    with start_honk(bed, tmp_path) as honk:
        honk.wait_for(r"interception installed lan=lan0 tproxy_port=7893")
        done = bed.curl(f"http://{url_host}:{HTTP_PORT}/")
        assert done.stdout == f"hello from server, peer={getattr(ROUTER_WAN, family)}"  # honk dialled it
        refused = bed.curl(f"http://{url_host}:{BLOCKED_PORT}/")
        assert refused.returncode != 0 and "hello" not in refused.stdout
        replies = udp_replies(bed, server, "ping", "pong")
        assert [r["reply"] for r in replies] == [
            f"echo:{p} seen-from={getattr(ROUTER_WAN, family)}" for p in ("ping", "pong")
        ]
        assert all(r["source"][0] == server and r["source"][1] == ECHO_PORT for r in replies)


def test_an_https_request_by_ip_is_routed_by_its_sniffed_server_name(bed, tmp_path):
    with start_honk(bed, tmp_path):
        blocked = bed.call(bed.client, "helpers.testbed:tls_hello", SERVER.v4, str(TLS_PORT), "blocked.test")
        allowed = bed.call(bed.client, "helpers.testbed:tls_hello", SERVER.v4, str(TLS_PORT), "fine.test")
    assert blocked.strip() in ("eof", "error:ConnectionResetError")
    assert allowed.strip() == f"reply:hello from server, peer={ROUTER_WAN.v4}"


def test_lan_dns_is_answered_by_honk_from_the_address_asked_and_teaches_names_to_ip_flows(bed, tmp_path):
    dns = bed.spawn(bed.server, "test_router_netns:dns_serve", json.dumps(DNS_RECORDS))
    with start_honk(bed, tmp_path, dial_mode="domain", extra=DNS_SECTION):
        # before honk's DNS gave the name out, an SNI by IP is not believed: the IP decides
        unverified = bed.call(
            bed.client, "helpers.testbed:tls_hello", SERVER.v4, str(TLS_PORT), "blocked.test"
        )
        assert unverified.strip() == f"reply:hello from server, peer={ROUTER_WAN.v4}"
        for family, nowhere in NOWHERE.items():
            answer = json.loads(bed.call(bed.client, "test_router_netns:dns_ask", nowhere, "blocked.test"))
            assert answer["ips"] == [SERVER.v4] and answer["qid"] == 0x4242, family
            assert answer["source"] == [nowhere, DNS_PORT], family  # answered from the address asked
        dns.wait_for(rf"asked from {ROUTER_WAN.v4}")  # honk's exchange with its upstream
        # now the name is learned for that IP: the sniffed SNI is verified and routes to block
        verified = bed.call(bed.client, "helpers.testbed:tls_hello", SERVER.v4, str(TLS_PORT), "blocked.test")
        assert verified.strip() in ("eof", "error:ConnectionResetError")


def test_the_kernel_parameters_are_set_when_asked(bed, tmp_path):
    bed.exec(bed.router, "sysctl", "-qw", "net.ipv4.ip_forward=0")
    bed.exec(bed.router, "sysctl", "-qw", f"net.ipv4.conf.{bed.lan}.rp_filter=1")
    with start_honk(bed, tmp_path):
        assert bed.exec(bed.router, "sysctl", "-n", "net.ipv4.ip_forward").stdout.strip() == "1"
        assert (
            bed.exec(bed.router, "sysctl", "-n", f"net.ipv4.conf.{bed.lan}.rp_filter").stdout.strip() == "0"
        )


def test_stopping_removes_everything_and_a_killed_run_is_recovered_by_the_next(bed, tmp_path):
    before = kernel_state(bed)
    honk = start_honk(bed, tmp_path)
    honk.wait_for(r"ebpf: kernel datapath on lan0")  # root here: the BPF backend, not memory
    during = kernel_state(bed)
    assert "table inet honk" in during and "lookup 2023" in during
    assert "honk_tc" in during  # the datapath's classifier on the LAN side (it is taken off on stop)
    assert honk.stop(STOP_TIMEOUT) == 0
    assert kernel_state(bed) == before  # nft, ip rules and routes, tc filters: all as they were

    killed = start_honk(bed, tmp_path)
    killed.signal(signal.SIGKILL)
    killed.proc.wait(STOP_TIMEOUT)
    assert "table inet honk" in kernel_state(bed)  # the dead run's table stays: the LAN fails closed
    assert bed.curl("--max-time", "2", f"http://{SERVER.v4}:{HTTP_PORT}/").returncode != 0
    with start_honk(bed, tmp_path) as again:
        state = kernel_state(bed)
        assert (
            state.count("table inet honk") == 1 and state.count("lookup 2023") == 2
        )  # replaced, not doubled
        assert (
            bed.curl(f"http://{SERVER.v4}:{HTTP_PORT}/").stdout == f"hello from server, peer={ROUTER_WAN.v4}"
        )
        assert again.stop(STOP_TIMEOUT) == 0
    assert kernel_state(bed) == before


def test_a_refused_interception_fails_the_start_with_its_reason(bed, tmp_path):
    path = tmp_path / "router.dae"
    path.write_text(router_config("nosuch0", tmp_path))
    before = kernel_state(bed)
    honk = HonkProcess(path, netns=bed.router)
    line = honk.wait_for(r"honk did not start: .*").group(0)
    assert "inbound tproxy" in line and "nosuch0" in line
    assert honk.proc.wait(STOP_TIMEOUT) == 1
    assert kernel_state(bed) == before


def test_a_reload_swaps_the_dial_mode_live_and_refuses_an_interception_change(bed, tmp_path):
    path = tmp_path / "router.dae"
    with start_honk(bed, tmp_path) as honk:  # domain++: the SNI routes
        hello = ("helpers.testbed:tls_hello", SERVER.v4, str(TLS_PORT), "blocked.test")
        assert bed.call(bed.client, *hello).strip() in ("eof", "error:ConnectionResetError")
        mark = honk.mark()
        path.write_text(router_config(bed.lan, tmp_path, dial_mode="ip"))
        honk.signal(signal.SIGHUP)
        honk.wait_for(r"config reloaded: .*swapped \[tproxy\]", after=mark)
        assert (
            bed.call(bed.client, *hello).strip() == f"reply:hello from server, peer={ROUTER_WAN.v4}"
        )  # no sniffing

        mark = honk.mark()
        path.write_text(router_config(f"{bed.lan},lan9", tmp_path, dial_mode="ip"))
        honk.signal(signal.SIGHUP)
        honk.wait_for(
            r"reload refused, keeping the running config: inbound tproxy: the transparent inbound's "
            r"interception changed",
            after=mark,
        )
        assert (
            bed.curl(f"http://{SERVER.v4}:{HTTP_PORT}/").stdout == f"hello from server, peer={ROUTER_WAN.v4}"
        )
        assert '"lan9"' not in bed.exec(bed.router, "nft", "list", "table", "inet", "honk").stdout
