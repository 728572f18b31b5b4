"""The transparent inbound's kernel state, as one thing to install and remove.

Three parts, installed in this order and removed in the reverse one:

1. kernel parameters (only with ``auto_config_kernel_parameter``): forwarding on, reverse
   path filtering off on the LAN interfaces (TPROXY delivers packets for foreign addresses,
   which a strict filter drops) and no ICMP redirects from them. They are not restored on
   removal: a router keeps forwarding when its proxy stops, and so does honk's upstream;
2. the policy routing that delivers marked packets locally (``routing.py``);
3. honk's nftables table (``nftables.py``), last, because it fails closed: once it is in,
   the LAN's new TCP and UDP flows reach honk's socket or are dropped.

Installing replaces whatever a crashed run left (the table is replaced in one transaction,
the rules are deleted before they are added). Removing deletes exactly what installing
added and is safe to repeat. The calls block on ``nft`` and ``ip``: the daemon runs them
in a thread.
"""

from __future__ import annotations

import logging
import os
import subprocess
from dataclasses import dataclass

from honk.netlink import nftables, routing

log = logging.getLogger("honk.netlink")

PROC_SYS = "/proc/sys"
AUTO_INTERFACE = "auto"  # wan_interface: the interface of the lowest-metric IPv4 default route


class InterceptionError(RuntimeError):
    """A part of the kernel state could not be installed; the message names the part."""


@dataclass(frozen=True, slots=True)
class KernelInterception:
    lan_interfaces: tuple[str, ...]
    tproxy_port: int
    mark: int = nftables.TPROXY_MARK
    auto_config_kernel_parameter: bool = False
    netns: str | None = None  # tests: act inside this named namespace instead of the current one
    wan_interfaces: tuple[str, ...] = ()  # the host's own traffic leaving these; ``auto``: see wans()

    @property
    def table(self) -> nftables.Interception:
        return nftables.Interception(
            self.lans(), self.tproxy_port, mark=self.mark, wan_interfaces=self.wans()
        )

    def lans(self) -> tuple[str, ...]:
        """The LAN interfaces by name (``auto`` resolved as in :meth:`wans`)."""
        return self._named(self.lan_interfaces, "lan_interface")

    def wans(self) -> tuple[str, ...]:
        """The WAN interfaces by name: ``auto`` is the interface of the lowest-metric IPv4 default
        route at install time (left out, with a warning, while there is none)."""
        return self._named(self.wan_interfaces, "wan_interface")

    def _named(self, names: tuple[str, ...], key: str) -> tuple[str, ...]:
        if AUTO_INTERFACE not in names:
            return names
        default = routing.default_route_interface(self.netns)
        if default is None:
            log.warning("%s auto: no IPv4 default route yet; its traffic is not intercepted", key)
        resolved = (default if name == AUTO_INTERFACE else name for name in names)
        return tuple(dict.fromkeys(name for name in resolved if name))

    @property
    def policy_routing(self) -> routing.PolicyRouting:
        return routing.PolicyRouting(mark=self.mark)

    def kernel_parameters(self) -> dict[str, str]:
        """The sysctls honk sets, by ``/proc/sys`` path."""
        wanted = {
            "net/ipv4/ip_forward": "1",
            "net/ipv6/conf/all/forwarding": "1",
            "net/ipv4/conf/all/rp_filter": "0",
        }
        for lan in self.lans():
            wanted[f"net/ipv4/conf/{lan}/rp_filter"] = "0"
            wanted[f"net/ipv4/conf/{lan}/send_redirects"] = "0"
        return wanted

    @property
    def follows_default_route(self) -> bool:
        """Whether an interface list says ``auto``: a default route change may change the table."""
        return AUTO_INTERFACE in self.lan_interfaces or AUTO_INTERFACE in self.wan_interfaces

    def install(self) -> nftables.Interception | None:
        """Raises :class:`InterceptionError`; a failure leaves nothing of honk's behind. Returns
        the table installed (None: pending, only ``auto`` and no default route yet)."""
        if self.auto_config_kernel_parameter:
            self._set_kernel_parameters()
        try:
            routing.install(self.policy_routing, self.netns)
        except routing.RoutingError as exc:
            self.remove()
            raise InterceptionError(f"policy routing: {exc}") from exc
        try:
            return self.install_table(self.table)
        except InterceptionError:
            self.remove()
            raise

    def install_table(self, table: nftables.Interception) -> nftables.Interception | None:
        """Replace honk's nftables table by ``table`` in one transaction (the policy routing
        stays); with no interface at all (``auto`` without a default route) the table is taken
        out, so nothing is diverted. Raises :class:`InterceptionError`."""
        pending = not table.lan_interfaces and not table.wan_interfaces
        try:
            nftables.run_nft(
                nftables.remove_script() if pending else nftables.install_script(table), netns=self.netns
            )
        except nftables.NftError as exc:
            raise InterceptionError(f"nftables: {exc}") from exc
        if pending:
            log.warning("interception pending: no interface yet (auto follows the default route)")
            return None
        wans = f" wan={','.join(table.wan_interfaces)}" if self.wan_interfaces else ""
        log.info(
            "interception installed lan=%s tproxy_port=%d%s",
            ",".join(table.lan_interfaces),
            self.tproxy_port,
            wans,
        )
        return table

    def remove(self) -> None:
        """Deletes the table, then the policy routing; what is already gone is no error."""
        try:
            nftables.run_nft(nftables.remove_script(), netns=self.netns)
        except nftables.NftError as exc:
            log.warning("removing the nftables table failed: %s", exc)
        try:
            routing.remove(self.policy_routing, self.netns)
        except routing.RoutingError as exc:
            log.warning("removing the policy routing failed: %s", exc)

    def _set_kernel_parameters(self) -> None:
        for path, value in self.kernel_parameters().items():
            try:
                write_sysctl(path, value, self.netns)
            except OSError as exc:
                raise InterceptionError(
                    f"kernel parameter {path.replace('/', '.')}: {exc.strerror or exc}"
                ) from exc
        log.info("kernel parameters set: forwarding on, rp_filter off on %s", ",".join(self.lans()))


def write_sysctl(path: str, value: str, netns: str | None = None) -> None:
    """Write one ``/proc/sys`` value (inside ``netns`` through ``ip netns exec``)."""
    if netns is None:
        with open(os.path.join(PROC_SYS, path), "w") as f:
            f.write(value)
        return
    done = subprocess.run(
        ["ip", "netns", "exec", netns, "sysctl", "-qw", f"{path.replace('/', '.')}={value}"],
        capture_output=True,
        text=True,
        timeout=routing.IP_TIMEOUT,
    )
    if done.returncode != 0:
        raise OSError(done.returncode, done.stderr.strip() or "sysctl failed")


def read_sysctl(path: str) -> str:
    with open(os.path.join(PROC_SYS, path)) as f:
        return f.read().strip()
