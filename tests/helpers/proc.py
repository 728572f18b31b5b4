"""Run ``honk`` as a real process and follow its log lines."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

READY_TIMEOUT = 20.0  # seconds for a cold interpreter to import honk and bind


class HonkProcess:
    """``honk run -c CONFIG`` in a subprocess; stderr lines are collected as they arrive.

    Waiting is event-driven: :meth:`wait_for` blocks on a condition variable that
    the reader thread notifies for every new line, never on a fixed sleep.
    """

    def __init__(self, config: Path | str, *args: str, env: dict[str, str] | None = None,
                 netns: str | None = None) -> None:
        if "--pid-file" not in args:  # each test daemon its own lock (root's default is shared)
            args = (*args, "--pid-file", str(Path(tempfile.mkdtemp(prefix="honk-test-")) / "honk.pid"))
        cmd = [sys.executable, "-m", "honk.cli.daemon", "run", "-c", str(config), *args]
        if netns is not None:  # `ip netns exec` execs the interpreter: the PID stays the daemon's
            cmd = ["ip", "netns", "exec", netns, *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

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
                    raise AssertionError(f"no log line {pattern!r} within {timeout}s:\n" + "\n".join(self.lines))
                self._cond.wait(left)

    def mark(self) -> int:
        """An index to pass as ``after`` so only later lines are searched."""
        with self._cond:
            return len(self.lines)

    def inbound(self, name: str = "lan") -> tuple[str, int]:
        """The bound address of an inbound, from the ready line."""
        m = self.wait_for(rf"honk ready .*inbound\.{re.escape(name)}=(\S+)")
        host, _, port = m.group(1).rpartition(":")
        return host.strip("[]"), int(port)

    def signal(self, sig: signal.Signals) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def __enter__(self) -> HonkProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _monotonic() -> float:
    import time

    return time.monotonic()
