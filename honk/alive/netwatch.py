"""Network-change watcher: the source of ``notify_network_change`` (GH-E-08).

After a relevant link, address or route change, cooldowns earned on the old
network are stale and dead states deserve a fresh probe. The kernel announces
such changes over rtnetlink; :class:`NetworkWatcher` subscribes to the link,
IPv4/IPv6 address and IPv4/IPv6 route groups of the daemon's own network
namespace and calls ``on_change(reason)`` once per burst of changes.

Which messages count is decided by :func:`classify`, a function of one message
and the remembered state, so it can be tested without sockets:

* a link that appears or disappears, or whose operstate or ``IFF_UP`` /
  ``IFF_RUNNING`` flags change (the kernel repeats ``RTM_NEWLINK`` for many
  other reasons: MTU, statistics, wireless events);
* an address that is added or removed, or whose DAD/deprecation flags change
  (IPv6 SLAAC refreshes lifetimes with an identical ``RTM_NEWADDR`` on every
  router advertisement, which is not a change);
* a main-table route added or removed (the local table and cloned/cache routes
  only mirror other changes).

At start the watcher dumps links and addresses on its own socket, so the first
repeat of an existing interface's state after start-up is not taken for a new
interface. A burst (an interface coming up brings its addresses and routes
within milliseconds, plus late linkwatch events) is coalesced: the first
relevant message arms a ``settle`` timer on the injected clock, and when it
fires ``on_change`` runs once with the first message's reason.

The socket is a plain non-blocking netlink socket watched with
``loop.add_reader``; :mod:`honk.alive.rtnl` decodes the messages (importing
pyroute2 would cost every honk process about 20 MB for three message types).
pyroute2's ``AsyncIPRoute`` would not do anyway: it opens its socket with
``create_datagram_endpoint``, which uvloop (the daemon's loop) refuses for
``AF_NETLINK`` ("invalid family 16").
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from honk.alive.rtnl import (
    IFA_F_DADFAILED,
    IFA_F_DEPRECATED,
    IFA_F_TENTATIVE,
    IFF_RUNNING,
    IFF_UP,
    NLMSG_DONE,
    NLMSG_ERROR,
    RTM_DELADDR,
    RTM_DELLINK,
    RTM_DELROUTE,
    RTM_GETADDR,
    RTM_GETLINK,
    RTM_NEWADDR,
    RTM_NEWLINK,
    RTM_NEWROUTE,
    RTMGRP_IPV4_IFADDR,
    RTMGRP_IPV4_ROUTE,
    RTMGRP_IPV6_IFADDR,
    RTMGRP_IPV6_ROUTE,
    RTMGRP_LINK,
    RtnlFormatError,
    dump_request,
    parse_messages,
)
from honk.core.clock import Clock, TimerHandle, timeout_at
from honk.core.errors import HonkError

__all__ = [
    "NETWORK_CHANGE_SETTLE",
    "REASON_ADDRESS",
    "REASON_LINK",
    "REASON_OVERFLOW",
    "REASON_ROUTE",
    "LinkSnapshot",
    "NetworkWatchError",
    "NetworkWatcher",
    "SeenState",
    "classify",
]

log = logging.getLogger(__name__)

# GH-E-08 leaves "relevant" and any debounce open; this value is the brief's choice.
NETWORK_CHANGE_SETTLE = (
    1.0  # seconds: coalesces a burst such as an interface coming up with its addresses and routes
)
BASELINE_TIMEOUT = 2.0  # seconds: start() waits at most this long for the link and address dump
NETLINK_RCVBUF = 1024 * 1024  # bytes: room for a flap's 10-20 messages times many interfaces
NETLINK_READ_SIZE = 64 * 1024  # bytes: larger than any rtnetlink datagram (dump parts are at most 32 KiB)
READS_PER_WAKEUP = 64  # datagrams handled per readiness callback before yielding to the loop

REASON_LINK = "link"
REASON_ADDRESS = "address"
REASON_ROUTE = "route"
REASON_OVERFLOW = "overflow"  # the kernel dropped events (ENOBUFS): something changed, we cannot say what

GROUPS = RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR | RTMGRP_IPV4_ROUTE | RTMGRP_IPV6_ROUTE

RT_TABLE_MAIN = 254  # <linux/rtnetlink.h>
RTM_F_CLONED = 0x200  # <linux/rtnetlink.h>: a cache/cloned route, never configured
LINK_FLAGS = IFF_UP | IFF_RUNNING  # the flags whose change is a link change
ADDRESS_FLAGS = IFA_F_TENTATIVE | IFA_F_DADFAILED | IFA_F_DEPRECATED  # flags that change usability


class NetworkWatchError(HonkError):
    """The rtnetlink subscription could not be opened; ``reason`` is a static word."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"network watch: {reason}")
        self.reason = reason


@dataclass(frozen=True, slots=True)
class LinkSnapshot:
    """What of a link matters for reachability: its operstate and the up/running flags."""

    operstate: str
    flags: int


@dataclass(slots=True)
class SeenState:
    """The last state :func:`classify` saw: links by ifindex, addresses with their relevant flags."""

    links: dict[int, LinkSnapshot] = field(default_factory=dict)
    addresses: dict[tuple[Any, ...], int] = field(default_factory=dict)

    def clear(self) -> None:
        self.links.clear()
        self.addresses.clear()


def classify(message: Any, last_state: SeenState) -> str | None:
    """The reason word if ``message`` (a decoded rtnetlink message: :class:`~honk.alive.rtnl.RtMessage`
    or pyroute2's) is a relevant
    change, else None. Updates ``last_state``, the only state it reads or writes."""
    kind = message["header"]["type"]
    if kind in (RTM_NEWLINK, RTM_DELLINK):
        return _classify_link(kind, message, last_state.links)
    if kind in (RTM_NEWADDR, RTM_DELADDR):
        return _classify_address(kind, message, last_state.addresses)
    if kind in (RTM_NEWROUTE, RTM_DELROUTE):
        table = message.get_attr("RTA_TABLE")
        if table is None:
            table = message["table"]
        if table != RT_TABLE_MAIN or message["flags"] & RTM_F_CLONED:
            return None
        return REASON_ROUTE
    return None


def _classify_link(kind: int, message: Any, links: dict[int, LinkSnapshot]) -> str | None:
    if message["family"] == socket.AF_BRIDGE:
        return None  # bridge-port notifications repeat a port's state under its own ifindex
    index = message["index"]
    if kind == RTM_DELLINK:
        links.pop(index, None)
        return REASON_LINK
    state = LinkSnapshot(message.get_attr("IFLA_OPERSTATE") or "UNKNOWN", message["flags"] & LINK_FLAGS)
    if links.get(index) == state:
        return None
    links[index] = state
    return REASON_LINK


def _classify_address(kind: int, message: Any, addresses: dict[tuple[Any, ...], int]) -> str | None:
    key = (
        message["index"],
        message["family"],
        message["prefixlen"],
        message.get_attr("IFA_LOCAL"),
        message.get_attr("IFA_ADDRESS"),
    )
    if kind == RTM_DELADDR:
        addresses.pop(key, None)
        return REASON_ADDRESS
    flags = message.get_attr("IFA_FLAGS")
    if flags is None:
        flags = message["flags"]
    flags &= ADDRESS_FLAGS
    if addresses.get(key) == flags:
        return None  # a lifetime refresh: the same address with the same usability
    addresses[key] = flags
    return REASON_ADDRESS


def _open_netlink() -> socket.socket:
    """A non-blocking rtnetlink socket subscribed to :data:`GROUPS` (the kernel picks the port id)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
    try:
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, NETLINK_RCVBUF)
        sock.bind((0, GROUPS))
    except BaseException:
        sock.close()
        raise
    return sock


class NetworkWatcher:
    """Calls ``on_change(reason)`` once per settled burst of relevant network changes.

    ``reason`` is ``"link"``, ``"address"`` or ``"route"`` (the first relevant
    message of the burst), or ``"overflow"`` when the kernel dropped events.
    ``on_change`` runs on the event loop and should return quickly; an exception
    from it is logged and the watcher carries on. Not thread-safe: one loop owns it.
    """

    def __init__(
        self, on_change: Callable[[str], None], clock: Clock, *, settle: float = NETWORK_CHANGE_SETTLE
    ) -> None:
        if settle < 0:
            raise ValueError("settle must not be negative")
        self._on_change = on_change
        self._clock = clock
        self._settle = settle
        self._seen = SeenState()
        self._sock: socket.socket | None = None
        self._port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: TimerHandle | None = None
        self._pending: str | None = None
        self._dumps: deque[int] = deque()  # request types of the baseline dumps still to send
        self._dump_seq = 0  # sequence number of the dump in flight, 0 when none
        self._seqs = itertools.count(1)
        self._baseline: asyncio.Event | None = None

    @property
    def running(self) -> bool:
        return self._sock is not None

    @property
    def seen(self) -> SeenState:
        """The remembered link and address state (for diagnostics and tests)."""
        return self._seen

    async def start(self) -> None:
        """Subscribe, then wait (bounded) for the baseline dump of links and addresses.

        Raises :class:`NetworkWatchError` when the netlink socket cannot be opened.
        Starting a running watcher does nothing.
        """
        if self._sock is not None:
            return
        loop = asyncio.get_running_loop()
        try:
            sock = _open_netlink()
        except OSError as e:
            raise NetworkWatchError("netlink-unavailable") from e
        self._sock, self._port, self._loop = sock, sock.getsockname()[0], loop
        self._baseline = baseline = asyncio.Event()
        try:
            loop.add_reader(sock.fileno(), self._readable)
            self._dumps.extend((RTM_GETLINK, RTM_GETADDR))
            self._send_next_dump()
            if self._sock is None:
                raise NetworkWatchError("netlink-unavailable")
            try:
                async with timeout_at(self._clock, self._clock.now() + BASELINE_TIMEOUT):
                    await baseline.wait()
            except TimeoutError:
                log.warning(
                    "network watch: no link/address baseline within %.1f s; watching anyway", BASELINE_TIMEOUT
                )
        except BaseException:
            self._close()
            raise

    async def stop(self) -> None:
        """Stop watching: cancel a pending notification and close the socket. Idempotent."""
        self._close()

    def feed(self, message: Any) -> None:
        """Take one parsed event message: a relevant one starts (or joins) the current burst."""
        reason = classify(message, self._seen)
        if reason is not None:
            self._note(reason)

    # --- burst coalescing ------------------------------------------------------

    def _note(self, reason: str) -> None:
        if self._timer is not None:
            return  # the burst's first reason stands
        self._pending = reason
        self._timer = self._clock.call_later(self._settle, self._fire)

    def _fire(self) -> None:
        reason, self._pending, self._timer = self._pending, None, None
        if reason is None:
            return
        try:
            self._on_change(reason)
        except Exception:
            log.exception("network watch: on_change failed")

    # --- socket ----------------------------------------------------------------

    def _readable(self) -> None:
        for _ in range(READS_PER_WAKEUP):
            sock = self._sock
            if sock is None:
                return
            try:
                data = sock.recv(NETLINK_READ_SIZE)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno == errno.ENOBUFS:
                    self._overflowed()
                    continue
                log.warning(
                    "network watch: netlink read failed (%s); no longer watching",
                    errno.errorcode.get(e.errno or 0, "error"),
                )
                self._close()
                return
            try:
                messages = parse_messages(data)
            except RtnlFormatError:
                log.debug("network watch: malformed netlink datagram dropped", exc_info=True)
                continue
            for message in messages:
                if self._sock is None:
                    return  # a failed dump request closed the watcher mid-datagram
                self._handle(message)

    def _handle(self, message: Any) -> None:
        header = message["header"]
        if self._dump_seq and header["sequence_number"] == self._dump_seq and header["pid"] == self._port:
            if header["type"] in (NLMSG_DONE, NLMSG_ERROR) or header.get("error") is not None:
                self._dump_done()
            else:
                classify(message, self._seen)  # baseline: remembered, never reported
            return
        self.feed(message)

    def _overflowed(self) -> None:
        log.info("network watch: the kernel dropped netlink events; treating it as a change")
        self._seen.clear()
        self._note(REASON_OVERFLOW)
        self._dumps.clear()
        self._dumps.extend((RTM_GETLINK, RTM_GETADDR))
        if not self._dump_seq:
            self._send_next_dump()

    def _send_next_dump(self) -> None:
        if not self._dumps or self._sock is None:
            self._dump_seq = 0
            if self._baseline is not None:
                self._baseline.set()
            return
        kind = self._dumps.popleft()
        self._dump_seq = next(self._seqs)
        try:
            self._sock.send(dump_request(kind, self._dump_seq))
        except OSError as e:
            log.warning(
                "network watch: netlink dump request failed (%s); no longer watching",
                errno.errorcode.get(e.errno or 0, "error"),
            )
            self._close()

    def _dump_done(self) -> None:
        self._dump_seq = 0
        self._send_next_dump()

    def _close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._pending = None, None
        self._dumps.clear()
        self._dump_seq = 0
        sock, self._sock = self._sock, None
        if self._baseline is not None:
            self._baseline.set()  # release a start() still waiting for the baseline
        if sock is None:
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(sock.fileno())
        sock.close()
