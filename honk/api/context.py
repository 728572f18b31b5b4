"""What the API reads and drives: the daemon's control surface.

The API owns no state of its own beyond per-request work. Every read goes to the
part that owns the data (the current plane for groups and nodes, the health
service for liveness and history, the tracker for flows, the log broker for
logs, the runtime stats for counters) and every write goes through the daemon's
serialized writer (:meth:`Control.select`, :meth:`Control.reload`), so a write
cannot be acknowledged against a manager a reload has replaced.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from honk.core.net import Network

if TYPE_CHECKING:
    from honk.api.server import ApiServer
    from honk.config.spec import Spec
    from honk.connection.mode import RoutingMode
    from honk.connection.plane import Plane
    from honk.connection.tracker import ConnectionTracker
    from honk.connection.warm import WarmUp
    from honk.control.health import HealthService
    from honk.core.clock import Clock
    from honk.core.logs import LogBroker
    from honk.core.stats import RuntimeStats
    from honk.dns.service import DnsService
    from honk.inbound.mixed import MixedInbound
    from honk.subscription.manager import SubscriptionManager


class Control(Protocol):
    """The daemon as the API sees it (:class:`honk.daemon.app.Daemon` implements it)."""

    clock: Clock
    config_path: Path
    tracker: ConnectionTracker
    health: HealthService
    logs: LogBroker
    stats: RuntimeStats
    mode: RoutingMode
    subscriptions: SubscriptionManager | None
    started_wall: float  # wall-clock seconds the daemon became ready
    started_at: float  # clock.now() at the same moment (uptime)
    api: ApiServer | None  # the listener serving this API (its bound address)
    inbounds: dict[str, MixedInbound]  # the listeners by name (their bound addresses)
    warm: WarmUp  # startup preconnect and the Selector pins (/stats warm)

    @property
    def plane(self) -> Plane | None:
        """The published plane: groups, outbounds and the spec that runs."""

    @property
    def dns_service(self) -> DnsService | None:
        """The running DNS service (None: no dns section): ``/dns/query``, ``/cache/dns/flush``,
        the DNS metrics. Read it per request: a reload may replace it."""

    @property
    def generation(self) -> int:
        """The published plane's generation (1 at start, +1 per applied change)."""

    async def check_spec(self, spec: Spec, path: str | os.PathLike[str]) -> Any:
        """The dry run of ``spec`` (``honk check``: everything a start would build, nothing bound);
        raises ApplyError."""

    async def select(self, group: str, member: str, network: Network | None = None) -> list[Network]:
        """A Selector write (``None``: both networks, all or nothing); the networks that changed."""

    async def pin(self, group: str, member: str | None, network: Network | None = None) -> list[Network]:
        """A URLTest/Fallback runtime pin (``member`` None: unpin); the networks that changed."""

    async def select_global(self, member: str) -> None:
        """Choose what GLOBAL serves in the global mode."""

    def global_members(self) -> list[str]:
        """GLOBAL's members: direct, block, the nodes, then the groups."""

    async def reload(self, allow_disruptive: bool = False) -> Any:
        """Apply the configuration file as it is now: the ApplyReport, or ApplyError
        (nothing changed); a change that ends live connections needs ``allow_disruptive``."""

    async def update(self, edit: Any, allow_disruptive: bool = False, runtime: Any = None) -> Any:
        """Edit the running configuration (``edit``: Spec -> Spec, or None) and apply it, with
        ``runtime`` (settings without resources) run in the same reconciler command."""

    async def set_users(self, user_set: str, users: Any) -> None:
        """Replace the users of an inbound's user set (no plan; ApplyError: no such set)."""

    async def upsert_user(self, user_set: str, user: Any) -> None:
        """Add or replace one user of a user set."""

    async def remove_user(self, user_set: str, username: str) -> bool:
        """Remove one user; whether it was there."""

    async def close_flows(self, flow_ids: Any, reason: str) -> list[str]:
        """Close live flows (None: all) as a reconciler command; the ids asked to end."""

    async def refresh_subscription(self, name: str) -> bool:
        """Fetch subscription ``name`` now; whether its new body was accepted. KeyError if unknown."""

    async def update_geodata(self, names: Any = None) -> Any:
        """Download, check and swap the configured geodata (None: every asset), reloading when a
        file changed: a :class:`honk.control.geoupdate.UpdateReport`; UpdateBusy while one runs."""


def running_plane(control: Control) -> Plane:
    """The published plane; a 503 while the daemon has none (starting or stopped)."""
    from honk.api.errors import ApiError

    plane = control.plane
    if plane is None:
        raise ApiError(503, "not_running", "honk is not running")
    return plane
