"""honk's own nftables table: the transparent interception of the LAN's TCP and UDP, and of the
host's own (``wan_interface``).

The ruleset is text for ``nft -f``, built from an :class:`Interception` (pure, so the rules
are tested as text and in check mode). Applying it is one atomic transaction that also
replaces a table a crashed run left behind; removing it deletes the table and nothing else.

What the prerouting chain does, for packets entering a LAN interface:

1. packets carrying honk's bypass mark (its own upstream sockets) are left alone;
2. destinations that are the router itself, private, link-local, loopback, multicast or
   broadcast are left alone (routed as usual);
3. packets of a connection honk already holds (``socket transparent 1``) get the TPROXY
   mark and are accepted, so they reach that socket;
4. new TCP and UDP flows are diverted to honk's TPROXY port with the same mark;
5. **fail closed**: anything still here (no honk socket listened, so ``tproxy`` fell
   through) is dropped. nft's ``tproxy`` statement lets a packet continue when nothing
   listens, which would forward the LAN's traffic un-proxied while honk is down or
   restarting; a router that must not leak traffic around its proxy drops it instead.

The host's own traffic (``wan_interfaces``) cannot be diverted where it is made: TPROXY works in
prerouting only. The output chain (a ``route`` chain, so a changed mark re-routes the packet)
therefore marks the host's new TCP and UDP leaving a WAN interface with the TPROXY mark,
skipping packets that already carry a mark (honk's own sockets: the bypass mark or a rule's
``direct(mark: N)``; programs routing by their own mark, such as WireGuard) and the host's own,
private and multicast destinations. The policy routing (``routing.py``) sends marked packets to ``lo``; they come back
through prerouting on ``lo`` still marked, and the divert chain hands them to honk's listener as
it does the LAN's. Replies from honk's transparent sockets go to a local address, leave by ``lo``
and are never marked. Only packets that were marked here are taken from ``lo``: local services
talking to each other over ``lo`` are left alone.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

TABLE = "honk"  # `table inet honk`
TPROXY_MARK = 0x08000000  # upstream's fixed tproxy_mark
BYPASS_MARK = 0x100  # the mark honk's own sockets carry (so_mark); never intercepted
NFT_TIMEOUT = 10.0  # seconds an nft invocation may take

# destinations that are never intercepted
BYPASS_V4 = (
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
)
BYPASS_V6 = ("::1/128", "fc00::/7", "fe80::/10", "ff00::/8")


class NftError(RuntimeError):
    """nft refused the ruleset or is missing; the message carries nft's own words."""


@dataclass(frozen=True, slots=True)
class Interception:
    lan_interfaces: tuple[str, ...]
    tproxy_port: int
    wan_interfaces: tuple[str, ...] = ()  # the host's own traffic leaving these is intercepted too
    mark: int = TPROXY_MARK
    bypass_mark: int = BYPASS_MARK
    bypass_v4: tuple[str, ...] = BYPASS_V4
    bypass_v6: tuple[str, ...] = BYPASS_V6


def _set(items: tuple[str, ...]) -> str:
    return "{ " + ", ".join(items) + " }"


def ruleset(spec: Interception) -> str:
    """The ``table inet honk`` definition for ``spec``."""
    if not spec.lan_interfaces and not spec.wan_interfaces:
        raise ValueError("interception needs a LAN or a WAN interface")
    if not 0 < spec.tproxy_port < 65536:
        raise ValueError(f"tproxy port {spec.tproxy_port} is out of range")
    mark = f"0x{spec.mark:08x}"
    bypass = f"0x{spec.bypass_mark:x}"
    port = spec.tproxy_port
    skip_destinations = """fib daddr type { local, broadcast, multicast } return
        ip daddr @bypass4 return
        ip6 daddr @bypass6 return"""
    prerouting = [f"meta mark & {bypass} == {bypass} return"]
    output = ""
    if spec.wan_interfaces:
        wans = _set(tuple(f'"{name}"' for name in spec.wan_interfaces))
        # the host's own flows the output chain marked, back from lo: divert them
        prerouting.append(f"iifname lo meta mark & {mark} == {mark} jump divert")
        # a socket carrying any mark is left to its mark's routing: honk's own (the bypass mark,
        # a rule's `direct(mark: N)`) and other programs' that route themselves (WireGuard's fwmark)
        output = f"""
    chain output {{
        type route hook output priority mangle; policy accept;
        meta mark != 0 return
        oifname != {wans} return
        {skip_destinations}
        meta l4proto {{ tcp, udp }} meta mark set {mark}
    }}"""
    if spec.lan_interfaces:
        lans = _set(tuple(f'"{name}"' for name in spec.lan_interfaces))
        prerouting += [f"iifname != {lans} return", skip_destinations, "jump divert"]
    else:
        prerouting.append("return")
    body = "\n        ".join(prerouting)
    return f"""table inet {TABLE} {{
    set bypass4 {{
        type ipv4_addr; flags interval;
        elements = {_set(spec.bypass_v4)}
    }}
    set bypass6 {{
        type ipv6_addr; flags interval;
        elements = {_set(spec.bypass_v6)}
    }}
    chain divert {{
        meta l4proto {{ tcp, udp }} socket transparent 1 meta mark set {mark} accept
        meta l4proto tcp tproxy ip to :{port} meta mark set {mark} accept
        meta l4proto udp tproxy ip to :{port} meta mark set {mark} accept
        meta l4proto tcp tproxy ip6 to :{port} meta mark set {mark} accept
        meta l4proto udp tproxy ip6 to :{port} meta mark set {mark} accept
        meta l4proto {{ tcp, udp }} drop
    }}
    chain prerouting {{
        type filter hook prerouting priority mangle; policy accept;
        {body}
    }}{output}
}}
"""


def install_script(spec: Interception) -> str:
    """One transaction: create the table if missing, empty it (a crashed run's leftovers
    included), then define it anew."""
    return f"add table inet {TABLE}\ndelete table inet {TABLE}\n{ruleset(spec)}"


def remove_script() -> str:
    """Deletes honk's table (creating it first, so removing twice is not an error)."""
    return f"add table inet {TABLE}\ndelete table inet {TABLE}\n"


def _nft(args: list[str], netns: str | None) -> list[str]:
    nft = shutil.which("nft")
    if nft is None:
        raise NftError("nft is not installed (Debian package nftables)")
    return [*(["ip", "netns", "exec", netns] if netns is not None else []), nft, *args]


def run_nft(script: str, *, check: bool = False, netns: str | None = None) -> None:
    """Apply ``script`` with ``nft -f -`` (``check``: validate it in the kernel, change
    nothing); ``netns``: inside that network namespace. Raises NftError."""
    command = _nft([*(["-c"] if check else []), "-f", "-"], netns)
    try:
        done = subprocess.run(command, input=script, capture_output=True, text=True, timeout=NFT_TIMEOUT)
    except subprocess.TimeoutExpired as exc:
        raise NftError(f"nft did not finish within {NFT_TIMEOUT:g}s") from exc
    if done.returncode != 0:
        raise NftError((done.stderr or done.stdout).strip() or f"nft exited with {done.returncode}")


def list_table(netns: str | None = None) -> str | None:
    """``nft list table inet honk`` as text, or None when the table does not exist."""
    done = subprocess.run(
        _nft(["list", "table", "inet", TABLE], netns), capture_output=True, text=True, timeout=NFT_TIMEOUT
    )
    return done.stdout if done.returncode == 0 else None
