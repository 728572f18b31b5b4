"""The subscription directory: which nodes each subscription currently provides.

Theory of operation
-------------------
* :meth:`SubscriptionManager.start` opens the store (when ``data_dir`` is
  given, i.e. ``global.store_subscribe``), parses each stored body so its nodes
  are available at once, publishes them, and starts one refresh task per
  subscription. A task fetches at once, then every ``interval`` seconds on the
  injected clock (``interval`` 0: once).
* A refresh that fails (download, encoding, format, no usable node) keeps the
  subscription's previous nodes and its stored body, and logs why. An
  accepted body replaces the nodes, is stored (``cache`` permitting), and
  ``publish`` is called if the set of nodes changed.
* :meth:`reload` takes new specs: a subscription whose fetch identity (URL and
  configured User-Agent) is unchanged keeps its nodes (renamed to its new tag)
  and refreshes at once in the background; removed ones drop their nodes. The
  caller applies :meth:`carried` first, so a reload does not publish.
* :meth:`stop` cancels every task and waits for them; a cancelled refresh
  records nothing.

Invariants: only the manager's own tasks change its state, all on one event
loop; ``publish`` receives a fresh ``{tag: nodes}`` dict and is never called
with the same node set twice in a row. Messages never contain a URL or a
credential.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import ssl
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from honk.config.spec import BUILTIN_OUTBOUNDS, NodeSpec, SubscriptionSpec
from honk.core.clock import Clock, timeout_at
from honk.core.logs import kv
from honk.core.stats import RuntimeStats
from honk.subscription.fetch import FILE_SCHEME, Dial, FetchResult, SubscriptionFetchError, fetch, read_local
from honk.subscription.formats import EntryDiagnostic, ParsedBody, SubscriptionError, parse_body
from honk.subscription.store import StoreError, SubscriptionStore, body_key

__all__ = [
    "FETCH_TIMEOUT",
    "FIRST_FETCH_WAIT",
    "NodesBySubscription",
    "SubscriptionManager",
    "SubscriptionState",
    "merge_nodes",
]

log = logging.getLogger("honk.subscription")

FETCH_TIMEOUT = 30.0  # seconds one download may take, redirects included
FIRST_FETCH_WAIT = 5.0  # seconds a start waits for first fetches ("bounded first-fetch wait", upstream)

NodesBySubscription = dict[str, tuple[NodeSpec, ...]]  # subscription tag -> its nodes
Publish = Callable[[NodesBySubscription], object]


@dataclass(frozen=True, slots=True)
class SubscriptionState:
    """What one subscription is doing, for logs, tests and (later) the API."""

    name: str
    nodes: int
    attempts: int  # refreshes finished (accepted or not) since start or the last reload
    last_error: str | None  # reason of the last refresh if it failed, else None
    restored: bool  # the nodes come from the store and no fetch has replaced them yet
    updated_at: float | None = None  # wall-clock seconds of the last accepted fetch, None before one
    usage: dict[str, int] | None = None  # the last accepted fetch's Subscription-Userinfo, if it had one


@dataclass(slots=True)
class _Sub:
    spec: SubscriptionSpec
    nodes: tuple[NodeSpec, ...] = ()
    attempts: int = 0
    last_error: str | None = None
    restored: bool = False
    updated_at: float | None = None
    usage: dict[str, int] | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        return body_key(self.spec.url, self.spec.user_agent)

    def state(self) -> SubscriptionState:
        return SubscriptionState(
            self.spec.name,
            len(self.nodes),
            self.attempts,
            self.last_error,
            self.restored,
            self.updated_at,
            self.usage,
        )


def _retag(nodes: tuple[NodeSpec, ...], name: str) -> tuple[NodeSpec, ...]:
    if all(n.subscription == name for n in nodes):
        return nodes
    return tuple(dataclasses.replace(n, subscription=name) for n in nodes)


def _signature(mapping: Mapping[str, Sequence[NodeSpec]]) -> tuple:
    """What "the set of nodes" means for publishing: tags, and each node's id and name."""
    return tuple((tag, tuple((n.id, n.name) for n in nodes)) for tag, nodes in mapping.items())


class SubscriptionManager:
    """Owner of the subscriptions' runtime state and refresh tasks (one event loop).

    ``data_dir`` None disables the store (``global.store_subscribe: false``).
    ``dial`` opens the connections downloads use (``DirectOutbound.dial_tcp``);
    a subscription with a ``detour`` downloads through ``dial_via(detour)``
    instead (the daemon resolves the name in its current plane at each fetch);
    ``dial_for(spec)``, asked at each download without a detour, may give another
    dial (the daemon's: one resolving the URL host through the upstream dae's
    ``sub()`` DNS rules pick); None keeps ``dial``;
    ``publish`` receives ``{tag: nodes}`` whenever the node set changes.
    """

    def __init__(
        self,
        specs: Sequence[SubscriptionSpec],
        data_dir: str | os.PathLike[str] | None,
        clock: Clock,
        dial: Dial,
        publish: Publish,
        *,
        ssl_context: ssl.SSLContext | None = None,
        fetch_timeout: float = FETCH_TIMEOUT,
        dial_via: Callable[[str], Dial] | None = None,
        dial_for: Callable[[SubscriptionSpec], Dial | None] | None = None,
    ) -> None:
        self._specs = tuple(specs)
        self._data_dir = data_dir
        self._clock = clock
        self._dial = dial
        self._dial_via = dial_via
        self._dial_for = dial_for
        self._publish = publish
        self._ssl_context = ssl_context
        self._fetch_timeout = fetch_timeout
        self._store: SubscriptionStore | None = None
        self._subs: dict[tuple[str, str], _Sub] = {}
        self._published: tuple = ()
        self._changed = asyncio.Condition()
        self._started = False
        self._stopped = False
        # the daemon's event counters (refresh results for /metrics); None: nothing is counted
        self.stats: RuntimeStats | None = None

    # --- reading ---------------------------------------------------------------------

    def nodes(self) -> NodesBySubscription:
        """The current nodes by subscription tag, in declaration order (tags without nodes left out)."""
        out: dict[str, list[NodeSpec]] = {}
        for sub in self._subs.values():
            if sub.nodes:
                out.setdefault(sub.spec.name, []).extend(sub.nodes)
        return {tag: tuple(nodes) for tag, nodes in out.items()}

    def states(self) -> tuple[SubscriptionState, ...]:
        return tuple(sub.state() for sub in self._subs.values())

    def carried(self, specs: Sequence[SubscriptionSpec]) -> NodesBySubscription:
        """The nodes a reload to ``specs`` keeps: those of unchanged fetch identities, retagged."""
        out: dict[str, list[NodeSpec]] = {}
        for spec in specs:
            old = self._subs.get(spec.fetch_identity)
            if old is not None and old.nodes:
                out.setdefault(spec.name, []).extend(_retag(old.nodes, spec.name))
        return {tag: tuple(nodes) for tag, nodes in out.items()}

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` holds; it is checked after every finished refresh."""
        async with self._changed:
            await self._changed.wait_for(predicate)

    async def wait_settled(self, timeout: float = FIRST_FETCH_WAIT) -> None:
        """Wait up to ``timeout`` seconds (on the clock) until every subscription without
        restored nodes has finished its first refresh."""

        def settled() -> bool:
            return all(sub.attempts or sub.restored for sub in self._subs.values())

        with contextlib.suppress(TimeoutError):
            async with timeout_at(self._clock, self._clock.now() + timeout):
                await self.wait_until(settled)

    # --- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Restore stored bodies (their nodes are published at once), then start refreshing."""
        if self._started:
            raise RuntimeError("subscription manager started twice")
        self._started = True
        subs = {spec.fetch_identity: _Sub(spec) for spec in self._specs}
        self._subs = subs
        if subs:
            await self._open_store()
        for sub in subs.values():
            await self._restore(sub)
        self._publish_if_changed()
        for sub in subs.values():
            self._launch(sub)
        if subs:
            log.info(
                "subscriptions started %s",
                kv(
                    subscriptions=len(subs),
                    store=self._store is not None,
                    restored=sum(s.restored for s in subs.values()),
                ),
            )

    async def reload(self, specs: Sequence[SubscriptionSpec]) -> None:
        """Switch to ``specs``; the caller has already applied :meth:`carried` of them."""
        old = self._subs
        new: dict[tuple[str, str], _Sub] = {}
        for spec in specs:
            previous = old.get(spec.fetch_identity)
            nodes = _retag(previous.nodes, spec.name) if previous is not None else ()
            new[spec.fetch_identity] = _Sub(spec, nodes=nodes)
        await self._cancel([sub.task for sub in old.values() if sub.task is not None])
        self._specs = tuple(specs)
        self._subs = new
        self._published = _signature(self.nodes())
        if new:
            await self._open_store()
        for sub in new.values():
            if self._store is not None and not sub.spec.cache:
                await self._forget(sub)
            self._launch(sub)
        dropped = len(old.keys() - new.keys())
        if old or new:
            log.info(
                "subscriptions reloaded %s",
                kv(subscriptions=len(new), kept=len(old.keys() & new.keys()), dropped=dropped),
            )

    async def stop(self) -> None:
        """Cancel every refresh and wait for it; close the store. Safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        await self._cancel([sub.task for sub in self._subs.values() if sub.task is not None])
        if self._store is not None:
            store, self._store = self._store, None
            await asyncio.to_thread(store.close)

    # --- inside ------------------------------------------------------------------------

    async def _open_store(self) -> None:
        if self._store is not None or self._data_dir is None:
            return
        try:
            self._store = await asyncio.to_thread(SubscriptionStore.open, self._data_dir)
        except StoreError as exc:
            log.warning("subscription store unavailable; bodies are not kept %s", kv(reason=exc.reason))

    async def _restore(self, sub: _Sub) -> None:
        if self._store is None:
            return
        if not sub.spec.cache:
            await self._forget(sub)
            return
        try:
            body = await asyncio.to_thread(self._store.load, sub.key)
            if body is None:
                return
            parsed = await asyncio.to_thread(parse_body, body, sub.spec.name)
        except (StoreError, SubscriptionError) as exc:
            log.warning(
                "stored subscription body ignored %s", kv(subscription=sub.spec.name, reason=exc.reason)
            )
            return
        sub.nodes, sub.restored = parsed.nodes, True
        log.info(
            "subscription restored from store %s", kv(subscription=sub.spec.name, nodes=len(parsed.nodes))
        )

    async def _forget(self, sub: _Sub) -> None:
        assert self._store is not None
        try:
            await asyncio.to_thread(self._store.delete, sub.key)
        except StoreError as exc:
            log.warning(
                "subscription store cleanup failed %s", kv(subscription=sub.spec.name, reason=exc.reason)
            )

    async def refresh_now(self, name: str) -> bool:
        """Fetch subscription ``name`` now, outside its schedule (the API's provider update);
        whether a new body was accepted. KeyError for a name the configuration does not have."""
        sub = next((s for s in self._subs.values() if s.spec.name == name), None)
        if sub is None:
            raise KeyError(name)
        attempts = sub.attempts
        await self._refresh(sub)
        return sub.attempts > attempts and sub.last_error is None

    def _launch(self, sub: _Sub) -> None:
        if self._stopped:
            return
        sub.task = asyncio.get_running_loop().create_task(
            self._run(sub), name=f"honk-subscription-{sub.spec.name}"
        )

    async def _cancel(self, tasks: list[asyncio.Task[None]]) -> None:
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(self, sub: _Sub) -> None:
        while True:
            try:
                await self._refresh(sub)
            except Exception:  # noqa: BLE001 - a bug in one refresh must not end the schedule
                log.exception("subscription refresh crashed %s", kv(subscription=sub.spec.name))
            if sub.spec.interval <= 0:
                return
            await self._clock.sleep(sub.spec.interval)

    async def _refresh(self, sub: _Sub) -> None:
        spec = sub.spec
        try:
            result = await self._download(spec)
            parsed = await asyncio.to_thread(parse_body, result.body, spec.name)
        except (SubscriptionFetchError, SubscriptionError) as exc:
            if isinstance(exc, SubscriptionError):
                _log_entries(spec.name, exc.diagnostics, exc.omitted)
            sub.attempts += 1
            sub.last_error = exc.reason
            if self.stats is not None:
                self.stats.subscription_refresh("failed")
            log.warning(
                "subscription refresh failed; previous nodes kept %s",
                kv(subscription=spec.name, reason=exc.reason, nodes_kept=len(sub.nodes)),
            )
            await self._notify()
            return
        await self._accept(sub, result.body, parsed, result.usage)

    async def _download(self, spec: SubscriptionSpec) -> FetchResult:
        if spec.url.startswith(FILE_SCHEME):  # dae's local node list
            return await asyncio.to_thread(read_local, spec.url)
        if spec.detour and self._dial_via:
            dial = self._dial_via(spec.detour)
        else:
            dial = (self._dial_for(spec) if self._dial_for is not None else None) or self._dial
        return await fetch(
            spec.url,
            dial=dial,
            clock=self._clock,
            deadline=self._clock.now() + self._fetch_timeout,
            user_agent=spec.user_agent,
            ssl_context=self._ssl_context,
        )

    async def _accept(self, sub: _Sub, body: bytes, parsed: ParsedBody, usage: dict[str, int] | None) -> None:
        spec = sub.spec
        _log_entries(spec.name, parsed.diagnostics, parsed.omitted)
        if self.stats is not None:
            same = [(n.id, n.name) for n in sub.nodes] == [(n.id, n.name) for n in parsed.nodes]
            self.stats.subscription_refresh("unchanged" if same else "accepted")
        sub.nodes, sub.restored, sub.last_error = parsed.nodes, False, None
        sub.updated_at, sub.usage = self._clock.wall(), usage
        sub.attempts += 1
        log.info(
            "subscription updated %s",
            kv(subscription=spec.name, nodes=len(parsed.nodes), skipped=parsed.skipped, format=parsed.format),
        )
        if self._store is not None and spec.cache:
            keep = {s.key for s in self._subs.values() if s.spec.cache}
            try:
                await asyncio.to_thread(self._store.save, sub.key, body, self._clock.wall(), keep)
            except StoreError as exc:  # the nodes still count; the stored body stays the previous one
                log.warning("subscription body not stored %s", kv(subscription=spec.name, reason=exc.reason))
        self._publish_if_changed()
        await self._notify()

    def _publish_if_changed(self) -> None:
        mapping = self.nodes()
        signature = _signature(mapping)
        if signature == self._published:
            return
        self._published = signature
        try:
            self._publish(mapping)
        except Exception:  # noqa: BLE001 - the consumer's failure is its own; the directory stays consistent
            log.exception("publishing subscription nodes failed")

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()


def _log_entries(name: str, diagnostics: Sequence[EntryDiagnostic], omitted: int) -> None:
    for d in diagnostics:
        log.info(
            "subscription entry skipped %s",
            kv(subscription=name, entry=d.index, reason=d.reason, **({"first": d.first} if d.first else {})),
        )
    if omitted:
        log.info(
            "subscription entry skipped %s",
            kv(subscription=name, reason="subscription-diagnostics-truncated", omitted=omitted),
        )


def merge_nodes(
    configured: Sequence[NodeSpec], published: Mapping[str, Sequence[NodeSpec]], groups: Iterable[str] = ()
) -> tuple[NodeSpec, ...]:
    """The nodes of an effective spec: the configured ones, then each subscription's.

    A subscription node whose name is taken (by a configured node, a builtin, a
    group, or an earlier subscription node) or whose id a configured node already
    has is left out; each subscription's clashes are logged once, as a count.
    """
    names = {n.name for n in configured} | set(BUILTIN_OUTBOUNDS) | set(groups)
    ids = {n.id for n in configured}
    out = list(configured)
    for tag, nodes in published.items():
        clashes = 0
        for node in nodes:
            if node.name in names or node.id in ids:
                clashes += 1
                continue
            names.add(node.name)
            ids.add(node.id)
            out.append(node)
        if clashes:
            log.warning(
                "subscription nodes left out: their name or endpoint is already declared %s",
                kv(subscription=tag, nodes=clashes),
            )
    return tuple(out)
