"""Run ``honk`` as a real process and follow its log lines.

Every process started here has its log checked when it stops: a line saying asyncio found an
exception nobody retrieved (``Task exception was never retrieved``, honk's loop guard logging
it, or asyncio's own handler after the guard is gone) fails the test, since such a task
failed silently in production too.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Self

READY_TIMEOUT = 20.0  # seconds for a cold interpreter to import honk and bind
READER_JOIN_TIMEOUT = 5.0  # seconds for the log reader to reach EOF once the process has exited
# what asyncio says of a task or future that failed and was never awaited (both handlers say it)
UNRETRIEVED = re.compile(r"exception was never retrieved")
TASKS_LINE = "honk-test tasks "  # the introspection line: this prefix, then JSON {coroutine: count}
TASKS_SIGNAL = signal.SIGUSR2  # honk leaves it alone; the introspecting launcher answers it

# `honk run` with one addition for soak tests: on TASKS_SIGNAL the daemon's loop writes its live
# tasks by coroutine to stderr, so a test can count them in a real daemon process. uvloop handles
# signals through the loop, so the handler goes on the loop the CLI creates.
_INTROSPECTING_LAUNCHER = f"""
import asyncio, collections, json, signal, sys
import uvloop
from honk.cli.daemon import main

_new_loop = uvloop.new_event_loop

def _tasks(loop):
    names = collections.Counter(t.get_coro().__qualname__ for t in asyncio.all_tasks(loop))
    print({TASKS_LINE!r} + json.dumps(dict(names), sort_keys=True), file=sys.stderr, flush=True)

def _introspected_loop():
    loop = _new_loop()
    loop.add_signal_handler({int(TASKS_SIGNAL)}, _tasks, loop)
    return loop

uvloop.new_event_loop = _introspected_loop
sys.argv[0] = "honk"
main()
"""


def unretrieved_lines(lines: list[str]) -> list[str]:
    """The lines of a captured log that report an exception nobody retrieved."""
    return [line for line in lines if UNRETRIEVED.search(line)]


class LoggedProcess:
    """A program whose stderr lines are collected as they arrive, and checked when it stops.

    Waiting is event-driven: :meth:`wait_for` blocks on a condition variable that
    the reader thread notifies for every new line, never on a fixed sleep.
    """

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self._log_checked = False

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()
        with self._cond:
            self.lines.append("<eof>")
            self._cond.notify_all()

    def wait_for(self, pattern: str, timeout: float = READY_TIMEOUT, after: int = 0) -> re.Match[str]:
        """The first log line at index >= ``after`` matching ``pattern``; AssertionError on timeout."""
        rx = re.compile(pattern)
        with self._cond:
            seen = after
            deadline = _monotonic() + timeout
            while True:
                for line in self.lines[seen:]:
                    if m := rx.search(line):
                        return m
                seen = len(self.lines)
                if "<eof>" in self.lines[after:]:
                    raise AssertionError(f"honk exited before {pattern!r}:\n" + "\n".join(self.lines))
                left = deadline - _monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"no log line {pattern!r} within {timeout}s:\n" + "\n".join(self.lines)
                    )
                self._cond.wait(left)

    def mark(self) -> int:
        """An index to pass as ``after`` so only later lines are searched."""
        with self._cond:
            return len(self.lines)

    def bound(self, key: str) -> tuple[str, int]:
        """An address the ready line names (``inbound.lan``, ``api``)."""
        m = self.wait_for(rf"honk ready .*\b{re.escape(key)}=(\S+)")
        host, _, port = m.group(1).rpartition(":")
        return host.strip("[]"), int(port)

    def inbound(self, name: str = "lan") -> tuple[str, int]:
        """The bound address of an inbound, from the ready line."""
        return self.bound(f"inbound.{name}")

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM (SIGKILL after ``timeout``), reap, then :meth:`check_log`; the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self.check_log()
        return code

    def check_log(self) -> None:
        """Fail (once) if the whole log, read to EOF, reports an exception nobody retrieved."""
        if self._log_checked:
            return
        self._log_checked = True
        self._reader.join(READER_JOIN_TIMEOUT)
        with self._cond:
            found = unretrieved_lines(self.lines)
        if found:
            raise AssertionError(
                f"pid {self.proc.pid} logged {len(found)} exception(s) nobody retrieved:\n"
                + "\n".join(found)
                + "\n--- whole log ---\n"
                + "\n".join(self.lines)
            )

    def open_fds(self) -> int:
        """How many file descriptors the process has open now (from /proc)."""
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class HonkProcess(LoggedProcess):
    """``honk run -c CONFIG`` in a subprocess.

    ``introspect``: run it through a launcher that answers :data:`TASKS_SIGNAL` with its live
    tasks (:meth:`tasks`); honk itself runs unchanged. ``nofile``: the descriptor limit it starts
    under, soft and hard.
    """

    def __init__(
        self,
        config: Path | str,
        *args: str,
        env: dict[str, str] | None = None,
        netns: str | None = None,
        introspect: bool = False,
        nofile: int | None = None,
    ) -> None:
        if "--pid-file" not in args:  # each test daemon its own lock (root's default is shared)
            args = (*args, "--pid-file", str(Path(tempfile.mkdtemp(prefix="honk-test-")) / "honk.pid"))
        program = ["-c", _INTROSPECTING_LAUNCHER] if introspect else ["-m", "honk.cli.daemon"]
        cmd = [sys.executable, *program, "run", "-c", str(config), *args]
        if nofile is not None:  # `ulimit -n NOFILE` (soft and hard); prlimit execs, so the PID stays honk's
            cmd = ["prlimit", f"--nofile={nofile}:{nofile}", "--", *cmd]
        if netns is not None:  # `ip netns exec` execs the interpreter: the PID stays the daemon's
            cmd = ["ip", "netns", "exec", netns, *cmd]
        super().__init__(cmd, env)

    def tasks(self, timeout: float = READY_TIMEOUT) -> collections.Counter[str]:
        """The daemon's live asyncio tasks by coroutine name (needs ``introspect``)."""
        after = self.mark()
        self.signal(TASKS_SIGNAL)
        m = self.wait_for(rf"^{re.escape(TASKS_LINE)}(\{{.*\}})$", timeout, after=after)
        return collections.Counter(json.loads(m.group(1)))


def _monotonic() -> float:
    import time

    return time.monotonic()
