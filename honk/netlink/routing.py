"""Policy routing for TPROXY: packets carrying the TPROXY mark are delivered locally.

The nftables rules mark diverted packets; these rules make the kernel deliver a marked
packet to a local socket (honk's transparent listener) instead of forwarding it:

    ip rule add fwmark MARK/MARK lookup TABLE priority PRIORITY      (IPv4 and IPv6)
    ip route replace local default dev lo table TABLE                (IPv4 and IPv6)

Installing first removes honk's own rules (a crashed run's leftovers), so it never
duplicates them; removing deletes exactly what installing adds. Both run the ``ip``
command (iproute2), which every router has; the daemon's netlink reader stays
import-light.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass

from honk.config.spec import TPROXY_MARK

ROUTE_TABLE = 2023  # the table holding honk's local-delivery routes (unused by distributions)
RULE_PRIORITY = 9999  # before the main table's rule (32766)
IP_TIMEOUT = 10.0  # seconds an ip invocation may take
MAX_STALE_RULES = 16  # a crashed run leaves at most a few; deleting stops after this many


class RoutingError(RuntimeError):
    """``ip`` refused a change or is missing; the message carries its own words."""


@dataclass(frozen=True, slots=True)
class PolicyRouting:
    mark: int = TPROXY_MARK
    table: int = ROUTE_TABLE
    priority: int = RULE_PRIORITY

    def rule(self, family: str) -> list[str]:
        return [
            family,
            "rule",
            "add",
            "fwmark",
            f"0x{self.mark:x}/0x{self.mark:x}",
            "lookup",
            str(self.table),
            "priority",
            str(self.priority),
        ]

    def route(self, family: str) -> list[str]:
        return [family, "route", "replace", "local", "default", "dev", "lo", "table", str(self.table)]


FAMILIES = ("-4", "-6")


def _ip(args: list[str], netns: str | None, *, check: bool = True) -> subprocess.CompletedProcess[str]:
    ip = shutil.which("ip")
    if ip is None:
        raise RoutingError("ip is not installed (Debian package iproute2)")
    command = [ip, *(["-n", netns] if netns else []), *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=IP_TIMEOUT)
    if check and done.returncode != 0:
        raise RoutingError(f"ip {' '.join(args)}: {(done.stderr or done.stdout).strip()}")
    return done


def install(routing: PolicyRouting, netns: str | None = None) -> None:
    """Add the rules and routes (after removing any honk left); RoutingError names the step."""
    remove(routing, netns)
    for family in FAMILIES:
        _ip(routing.rule(family), netns)
        _ip(routing.route(family), netns)


def remove(routing: PolicyRouting, netns: str | None = None) -> None:
    """Delete honk's rules (every copy) and flush its table; absent ones are no error."""
    for family in FAMILIES:
        delete = [
            family,
            "rule",
            "del",
            "fwmark",
            f"0x{routing.mark:x}/0x{routing.mark:x}",
            "lookup",
            str(routing.table),
            "priority",
            str(routing.priority),
        ]
        for _ in range(MAX_STALE_RULES):
            if _ip(delete, netns, check=False).returncode != 0:
                break
        _ip([family, "route", "flush", "table", str(routing.table)], netns, check=False)


def default_route_interface(netns: str | None = None) -> str | None:
    """The interface of the lowest-metric IPv4 default route (the main table), or None."""
    try:
        done = _ip(["-4", "-j", "route", "show", "default"], netns, check=False)
        routes = json.loads(done.stdout or "[]") if done.returncode == 0 else []
    except (RoutingError, ValueError, OSError, subprocess.TimeoutExpired):
        return None
    best = min(
        (r for r in routes if isinstance(r, dict) and r.get("dev")),
        key=lambda r: int(r.get("metric", 0)),
        default=None,
    )
    return str(best["dev"]) if best is not None else None
