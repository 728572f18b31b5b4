"""The reconciler: the one task through which every change to what runs passes.

Commands arrive on a queue of :data:`COMMAND_QUEUE_CAPACITY` and run one at a time to
completion: an apply (plan, disruption check, prepare, commit), an update (an edit of
the running desired state, then an apply), a selection write, a subscription's new
node set, shutdown. Serialization comes from the single consumer, not from a lock, so
two applies never interleave and a selection write is never acknowledged against a
group manager a commit has already replaced.

A caller that gives up while waiting for room in the queue sends nothing; once a
command is queued it runs whatever the caller does, and its answer is dropped if the
caller has gone (an HTTP client that disconnects during a reload still gets it applied).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from honk.control.errors import Stopped

log = logging.getLogger("honk.reload")

COMMAND_QUEUE_CAPACITY = 16  # "mpsc::channel(16)": commands waiting for the reconciler

T = TypeVar("T")


@dataclass(slots=True)
class _Command:
    name: str
    run: Callable[[], Awaitable[Any]]
    reply: asyncio.Future[Any]


class Reconciler:
    """Runs commands one at a time on its own task."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[_Command | None] = asyncio.Queue(maxsize=COMMAND_QUEUE_CAPACITY)
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self.running: str | None = None  # the command being executed (instrumentation)
        self.executed = 0  # commands run to completion
        self._signal_reload_queued = False  # a SIGHUP reload waits in the queue, not started
        self._signal_tasks: set[asyncio.Task[None]] = set()

    @property
    def stopped(self) -> bool:
        return self._stopped

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="honk-reconciler")

    async def call(self, name: str, run: Callable[[], Awaitable[T]]) -> T:
        """Queue ``run`` and wait for its result (raises what it raises, or Stopped)."""
        if self._stopped:
            raise Stopped()
        reply: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        await self._queue.put(_Command(name, run, reply))  # cancelled here: nothing was sent
        if self._stopped and not reply.done():
            raise Stopped()
        return await asyncio.shield(reply)  # cancelled here: it still runs; the answer is dropped

    def signal_reload(self, run: Callable[[], Awaitable[Any]]) -> None:
        """A SIGHUP, from the signal handler: never blocks, and is queued at once (in order
        with the commands that follow it) unless the queue is full. One already waiting to
        start absorbs this one (the file is read when the command starts); one running lets
        exactly one more queue."""
        if self._stopped or self._signal_reload_queued:
            return
        self._signal_reload_queued = True

        async def reload() -> Any:
            self._signal_reload_queued = False
            return await run()

        reply: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        reply.add_done_callback(_signal_outcome)
        command = _Command("sighup-reload", reload, reply)
        try:
            self._queue.put_nowait(command)
        except asyncio.QueueFull:  # sixteen commands wait: queue it as soon as there is room
            task = asyncio.get_running_loop().create_task(self._queue.put(command), name="honk-sighup")
            self._signal_tasks.add(task)
            task.add_done_callback(self._signal_tasks.discard)

    async def stop(self, run: Callable[[], Awaitable[Any]] | None = None) -> None:
        """Run ``run`` (the shutdown) as the last command, then exit; later calls raise Stopped."""
        if self._task is None:
            self._stopped = True
            if run is not None:
                await run()
            return
        if self._stopped:
            return
        try:
            if run is not None:
                await self.call("shutdown", run)
        finally:
            self._stopped = True
            await self._queue.put(None)
            await self._task
            for task in list(self._signal_tasks):
                task.cancel()

    async def _run(self) -> None:
        while True:
            command = await self._queue.get()
            if command is None:
                break
            if command.reply.done():  # the caller was told Stopped
                continue
            self.running = command.name
            try:
                result = await command.run()
            except asyncio.CancelledError:
                if not command.reply.done():
                    command.reply.cancel()
                raise
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                if not command.reply.done():
                    command.reply.set_exception(exc)
                    command.reply.exception()  # a caller that left must not make it "never retrieved"
            else:
                if not command.reply.done():
                    command.reply.set_result(result)
            finally:
                self.running = None
                self.executed += 1
        # anything still queued after shutdown learns it will not run
        while not self._queue.empty():
            left = self._queue.get_nowait()
            if left is not None and not left.reply.done():
                left.reply.set_exception(Stopped())
                left.reply.exception()


def _signal_outcome(reply: asyncio.Future[Any]) -> None:
    """Nobody awaits a SIGHUP's reply: the reload logged its own outcome."""
    if not reply.cancelled() and reply.exception() is not None:
        log.debug("signal reload ended with an error: %s", reply.exception())
