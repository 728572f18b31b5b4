"""The PID lock: one holder per file, a stale file never blocks, signals reach only a live holder.

POSIX ``lockf`` locks belong to a process, so every "other instance" here is a real
child process. The test process never reads a file it holds: closing any descriptor of
it would drop the lock (the module guards its own opens against that).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from honk.daemon import pidlock
from honk.daemon.pidlock import AlreadyRunning, NotRunning, PidLock, default_pid_path, signal_running

# A child that takes the lock, says so, prints "hup" on SIGHUP, and exits when stdin closes.
HOLDER = """
import signal, sys
from honk.daemon.pidlock import PidLock
signal.signal(signal.SIGHUP, lambda *a: print("hup", flush=True))
lock = PidLock(sys.argv[1])
lock.acquire()
print("locked", flush=True)
sys.stdin.read()
lock.release()
print("released", flush=True)
"""

# A child that tries the lock once and reports the outcome.
PROBE = """
import sys
from honk.daemon.pidlock import AlreadyRunning, PidLock
try:
    PidLock(sys.argv[1]).acquire()
except AlreadyRunning as exc:
    print("held", exc.pid)
else:
    print("free")
"""


class Holder:
    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.readline() == "locked"

    def readline(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline().strip()

    def finish(self) -> str:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        out = self.readline()
        self.proc.wait(10)
        return out

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def probe(path: Path) -> str:
    out = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.fixture
def holder(tmp_path):
    h = Holder(tmp_path / "run" / "honk.pid")
    yield h
    if h.proc.poll() is None:
        h.kill()


def test_acquire_creates_the_file_with_our_pid_and_mode_644(tmp_path):
    path = tmp_path / "sub" / "honk.pid"
    with PidLock(path) as lock:
        assert lock.held
        assert probe(path) == f"held {os.getpid()}"  # the pid the child read from the file
        assert path.stat().st_mode & 0o777 == 0o644
    assert path.read_text() == ""


def test_a_second_instance_is_refused_with_the_holders_pid(tmp_path, holder):
    path = tmp_path / "run" / "honk.pid"
    with pytest.raises(AlreadyRunning) as info:
        PidLock(path).acquire()
    assert info.value.pid == holder.proc.pid
    assert f"pid {holder.proc.pid}" in str(info.value) and str(path) in str(info.value)


def test_a_second_acquisition_in_the_same_process_is_refused_and_keeps_the_first_lock(tmp_path):
    path = tmp_path / "honk.pid"
    first = PidLock(path)
    first.acquire()
    try:
        with pytest.raises(AlreadyRunning) as info:
            PidLock(path).acquire()
        assert info.value.pid == os.getpid()
        assert probe(path) == f"held {os.getpid()}"  # the refused attempt did not drop our lock
    finally:
        first.release()


def test_release_empties_the_file_and_frees_the_lock(tmp_path):
    path = tmp_path / "honk.pid"
    lock = PidLock(path)
    lock.acquire()
    lock.release()
    assert not lock.held
    assert path.read_text() == ""
    assert probe(path) == "free"
    lock.release()  # a second release is a no-op


def test_a_stale_file_from_a_killed_holder_neither_blocks_a_start_nor_gets_a_signal(tmp_path, holder):
    path = tmp_path / "run" / "honk.pid"
    pid = holder.proc.pid
    holder.kill()  # SIGKILL: no release, the file still names the dead pid
    assert path.read_text().strip() == str(pid)
    with pytest.raises(NotRunning) as info:
        signal_running(path, signal.SIGHUP)
    assert str(info.value) == f"honk is not running: nothing holds the lock on {path}"
    with PidLock(path):
        assert probe(path) == f"held {os.getpid()}"


def test_signal_running_delivers_the_signal_to_the_holder_and_returns_its_pid(tmp_path, holder):
    path = tmp_path / "run" / "honk.pid"
    assert signal_running(path, signal.SIGHUP) == holder.proc.pid
    assert holder.readline() == "hup"
    assert holder.finish() == "released"  # the probe did not disturb the holder's lock


def test_signal_running_without_a_file_is_not_running(tmp_path):
    path = tmp_path / "absent.pid"
    with pytest.raises(NotRunning) as info:
        signal_running(path, signal.SIGHUP)
    assert str(info.value) == f"honk is not running: no lock file at {path}"


def test_signal_running_in_the_holding_process_names_it_without_touching_the_lock(tmp_path):
    path = tmp_path / "honk.pid"
    with PidLock(path):
        assert pidlock.running_pid(path) == os.getpid()
        assert probe(path) == f"held {os.getpid()}"


def test_default_path_is_under_data_dir_when_not_root(tmp_path, monkeypatch):
    monkeypatch.setattr(pidlock.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(pidlock, "RUN_DIR", str(tmp_path / "run" / "honk"))
    assert default_pid_path(tmp_path / "data") == tmp_path / "data" / "honk.pid"
    assert not (tmp_path / "run").exists()


def test_default_path_for_root_is_the_run_dir_which_is_created(tmp_path, monkeypatch):
    run_dir = tmp_path / "run" / "honk"
    monkeypatch.setattr(pidlock.os, "geteuid", lambda: 0)
    monkeypatch.setattr(pidlock, "RUN_DIR", str(run_dir))
    assert default_pid_path(tmp_path / "data") == run_dir / "honk.pid"
    assert run_dir.is_dir()


def test_default_path_for_root_falls_back_to_data_dir_when_the_run_dir_cannot_exist(tmp_path, monkeypatch):
    blocker = tmp_path / "run"
    blocker.write_text("a file where a directory should be")
    monkeypatch.setattr(pidlock.os, "geteuid", lambda: 0)
    monkeypatch.setattr(pidlock, "RUN_DIR", str(blocker / "honk"))
    assert default_pid_path(tmp_path / "data") == tmp_path / "data" / "honk.pid"
