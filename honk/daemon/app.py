"""The daemon: one owner for the running configuration and its listeners.

Theory of operation
-------------------
``Daemon.start`` loads the file, builds a :class:`~honk.connection.plane.Plane`
(routes, groups, outbounds), hands it to the :class:`Dispatcher`, binds every
inbound and starts the idle sweeper. After that, every change to what runs goes
through one ``asyncio.Lock``:

* ``reload()`` (SIGHUP) loads the file again. A file that does not load changes
  nothing: the old plane and listeners keep serving and the located errors are
  logged. A file that loads becomes a new plane; the dispatcher swaps it in one
  reference assignment, so a new flow sees either the old or the new plane, and
  established flows keep their sockets. Listeners whose spec is unchanged keep
  their socket; changed or new ones are bound before the old ones stop, and a
  bind failure undoes the whole reload.
* ``shutdown()`` (SIGTERM/SIGINT) stops accepting, lets live flows finish
  within the grace period, then closes what is left.

This is the foundation's "full rebuild" reload; the plan → prepare → commit
reconciler replaces the middle of ``reload()`` later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path

from honk.config.diagnostics import ConfigError, Severity
from honk.config.load import load_file
from honk.config.spec import InboundSpec, Spec
from honk.connection.dispatch import Dispatcher
from honk.connection.plane import Plane, SystemResolver, build_plane
from honk.connection.tracker import ConnectionTracker
from honk.core.clock import Clock, MonotonicClock
from honk.daemon.logs import kv, set_level
from honk.inbound.mixed import MixedInbound
from honk.relay.native import close_engines

log = logging.getLogger("honk.daemon")

SWEEP_INTERVAL = 1.0  # seconds between idle sweeps of the connection table


def log_diagnostics(diagnostics, *, during: str) -> None:
    """Log each config finding at its own severity; never with config values."""
    for d in diagnostics:
        level = {Severity.ERROR: logging.ERROR, Severity.WARNING: logging.WARNING}.get(
            d.severity, logging.INFO
        )
        log.log(level, "config %s %s", d.severity.value, kv(during=during, at=str(d.loc), key=d.key_path,
                                                            code=d.code, problem=d.message))


class Daemon:
    def __init__(self, config_path: str | os.PathLike, clock: Clock | None = None,
                 log_level: str | None = None) -> None:
        self.config_path = Path(config_path)
        self._forced_log_level = log_level  # `honk run --debug` outranks the file's log_level
        self.clock: Clock = clock or MonotonicClock()
        self.spec: Spec | None = None
        self.plane: Plane | None = None
        self.tracker = ConnectionTracker(self.clock)
        self.dispatcher: Dispatcher | None = None
        self.inbounds: dict[str, MixedInbound] = {}
        self._lock = asyncio.Lock()
        self._sweeper: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._generation = 0

    # --- start ---------------------------------------------------------------

    async def start(self) -> None:
        """Load, build and bind; raises ConfigError or OSError and leaves nothing running."""
        spec = load_file(self.config_path)
        log_diagnostics(spec.diagnostics, during="start")
        self._set_log_level(spec)
        Path(spec.global_.data_dir).mkdir(parents=True, exist_ok=True)
        self._generation = 1
        plane = build_plane(spec, self.clock, self._generation)
        resolver = SystemResolver(self.clock, spec.global_.connect_timeout)
        self.dispatcher = Dispatcher(plane, self.tracker, self.clock, spec.global_, resolver)
        started: dict[str, MixedInbound] = {}
        try:
            for ispec in spec.inbounds:
                started[ispec.name] = await self._bind(ispec)
        except BaseException:
            for inbound in started.values():
                await inbound.stop_accepting()
            raise
        self.spec, self.plane, self.inbounds = spec, plane, started
        self._sweeper = asyncio.get_running_loop().create_task(
            self.tracker.run_sweeper(SWEEP_INTERVAL), name="honk-idle-sweeper"
        )
        log.info("honk ready %s", kv(config=str(self.config_path), generation=self._generation,
                                     **{f"inbound.{n}": str(i.bound) for n, i in started.items()}))

    def _set_log_level(self, spec: Spec) -> None:
        set_level(self._forced_log_level or spec.global_.log_level)

    async def _bind(self, ispec: InboundSpec) -> MixedInbound:
        if self.dispatcher is None:
            raise RuntimeError("dispatcher missing")
        inbound = MixedInbound(ispec, self.dispatcher, self.clock)
        await inbound.start()
        return inbound

    # --- reload --------------------------------------------------------------

    async def reload(self) -> bool:
        """Apply the file as it is now; return whether it was applied."""
        async with self._lock:
            try:
                spec = load_file(self.config_path)
            except ConfigError as exc:
                log_diagnostics(exc.diagnostics, during="reload")
                log.error("reload rejected; the running configuration is unchanged %s",
                          kv(errors=len(exc.errors), generation=self._generation))
                return False
            except OSError as exc:
                log.error("reload rejected; the running configuration is unchanged %s",
                          kv(error=type(exc).__name__, reason=exc.strerror or str(exc)))
                return False
            return await self._apply(spec)

    async def _apply(self, spec: Spec) -> bool:
        assert self.spec is not None and self.dispatcher is not None  # set by start()
        log_diagnostics(spec.diagnostics, during="reload")
        generation = self._generation + 1
        try:
            plane = build_plane(spec, self.clock, generation, previous=self.plane)
        except Exception as exc:  # noqa: BLE001 - a plane that cannot be built must not replace the old one
            log.error("reload rejected; the running configuration is unchanged %s",
                      kv(error=type(exc).__name__, reason=str(exc)))
            return False

        old = {i.name: i for i in self.spec.inbounds}
        new = {i.name: i for i in spec.inbounds}
        keep = {n for n in new if n in old and old[n] == new[n]}
        bound: dict[str, MixedInbound] = {}
        try:
            for name in new.keys() - keep:
                if name in old and (old[name].host, old[name].port) == (new[name].host, new[name].port):
                    continue  # same address, changed settings: rebind after the old one stops
                bound[name] = await self._bind(new[name])
        except OSError as exc:
            for inbound in bound.values():
                await inbound.stop_accepting()
            log.error("reload rejected; the running configuration is unchanged %s",
                      kv(error="bind-failed", reason=exc.strerror or str(exc)))
            return False

        # Commit: nothing below may fail the reload.
        resolver = SystemResolver(self.clock, spec.global_.connect_timeout)
        self.dispatcher.swap_plane(plane, spec.global_, resolver)
        self._set_log_level(spec)
        for name in old.keys() - keep:
            await self.inbounds.pop(name).stop_accepting()
        for name in new.keys() - keep - bound.keys():
            try:
                bound[name] = await self._bind(new[name])
            except OSError as exc:
                log.error("inbound could not be rebound %s", kv(inbound=name, reason=exc.strerror or str(exc)))
        self.inbounds.update(bound)
        self.spec, self.plane, self._generation = spec, plane, generation
        log.info("reload applied %s", kv(generation=generation, inbounds_kept=len(keep),
                                         inbounds_started=len(bound), live_flows=len(self.tracker)))
        return True

    # --- shutdown ------------------------------------------------------------

    async def shutdown(self, grace: float | None = None) -> None:
        """Stop accepting, wait up to ``grace`` seconds for live flows, then close the rest."""
        async with self._lock:
            if grace is None:
                grace = self.spec.global_.shutdown_grace if self.spec else 0.0
            for inbound in self.inbounds.values():
                await inbound.stop_accepting()
            self.inbounds.clear()
            live = len(self.tracker)
            if live:
                log.info("draining %s", kv(live_flows=live, grace_s=grace))
                idle = asyncio.ensure_future(self.tracker.wait_idle())
                timer = asyncio.ensure_future(self.clock.sleep(grace))
                await asyncio.wait({idle, timer}, return_when=asyncio.FIRST_COMPLETED)
                for fut in (idle, timer):
                    fut.cancel()
                left = len(self.tracker)
                if left:
                    self.tracker.close_all("shutdown")
                    log.info("closed flows left after grace %s", kv(closed=left))
            if self._sweeper is not None:
                self._sweeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._sweeper
            close_engines()  # joins the native relay worker and closes its fds
            log.info("honk stopped")
            self._stopped.set()

    # --- the process -----------------------------------------------------------

    async def run_forever(self) -> None:
        """Start, then serve until SIGTERM/SIGINT; SIGHUP reloads.

        Handlers are installed before ``start`` so a signal that arrives as soon as
        the ready line is out is already ours; a SIGHUP during start waits on the
        lock and then reloads.
        """
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        reloads: set[asyncio.Task[bool]] = set()

        def on_hup() -> None:
            if self.spec is None:
                return  # nothing to reload yet; start() reads the file as it is
            task = loop.create_task(self.reload(), name="honk-reload")
            reloads.add(task)
            task.add_done_callback(reloads.discard)

        loop.add_signal_handler(signal.SIGHUP, on_hup)
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        try:
            await self.start()
            await stop.wait()
            log.info("stop requested; no new flows are accepted")
            await self.shutdown()
        finally:
            for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
