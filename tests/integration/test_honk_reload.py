"""`honk reload` finds the running daemon through its PID lock file and signals it; one daemon
per lock file; a stale lock file (a killed daemon) neither blocks a start nor gets a signal."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from helpers.proc import HonkProcess

from honk.cli.daemon import EXIT_CONFIG, EXIT_NOT_RUNNING, EXIT_RUNTIME

REPO = Path(__file__).resolve().parents[2]


def write_config(path: Path, fallback: str = "direct") -> None:
    path.write_text(
        "global {\n"
        "    data_dir: ./var\n"
        "    tcp_check_url: ''\n"
        "}\n"
        "inbound {\n"
        "    lan: 'mixed://127.0.0.1:0'\n"
        "}\n"
        "routing {\n"
        f"    fallback: {fallback}\n"
        "}\n"
    )


def honk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "honk.cli.daemon", *args], capture_output=True, text=True, cwd=REPO, timeout=60
    )


def test_honk_reload_signals_the_running_daemon_which_applies_the_changed_file(tmp_path):
    cfg, pid_file = tmp_path / "honk.dae", tmp_path / "run" / "honk.pid"
    write_config(cfg)
    with HonkProcess(cfg, "--pid-file", str(pid_file)) as daemon:
        daemon.inbound()  # ready
        assert pid_file.read_text() == f"{daemon.proc.pid}\n"
        write_config(cfg, fallback="block")
        mark = daemon.mark()
        out = honk("reload", "-c", str(cfg), "--pid-file", str(pid_file))
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"reload signalled to pid {daemon.proc.pid}"
        daemon.wait_for(r"config reloaded: built \[route\]", after=mark)
        assert daemon.stop() == 0
    assert pid_file.read_text() == ""  # released on a clean stop
    out = honk("reload", "--pid-file", str(pid_file))
    assert out.returncode == EXIT_NOT_RUNNING == 3
    assert out.stderr.strip() == f"honk is not running: nothing holds the lock on {pid_file}"


def test_a_second_honk_run_with_the_same_pid_file_exits_with_a_clear_message(tmp_path):
    cfg, pid_file = tmp_path / "honk.dae", tmp_path / "honk.pid"
    write_config(cfg)
    with HonkProcess(cfg, "--pid-file", str(pid_file)) as first:
        first.inbound()
        second = honk("run", "-c", str(cfg), "--pid-file", str(pid_file))
        assert second.returncode == EXIT_RUNTIME
        assert (
            f"honk did not start: honk is already running (pid {first.proc.pid}; lock file {pid_file})"
            in second.stderr
        )
        assert first.proc.poll() is None  # the refused start did not disturb the running one
        assert pid_file.read_text() == f"{first.proc.pid}\n"


def test_a_killed_daemons_lock_file_neither_blocks_a_new_start_nor_gets_the_signal(tmp_path):
    cfg, pid_file = tmp_path / "honk.dae", tmp_path / "honk.pid"
    write_config(cfg)
    with HonkProcess(cfg, "--pid-file", str(pid_file)) as first:
        first.inbound()
        first.signal(signal.SIGKILL)
        first.proc.wait(15)
    dead = first.proc.pid
    assert pid_file.read_text() == f"{dead}\n"  # SIGKILL: nothing cleaned up
    out = honk("reload", "--pid-file", str(pid_file))
    assert out.returncode == EXIT_NOT_RUNNING and "nothing holds the lock" in out.stderr
    with HonkProcess(cfg, "--pid-file", str(pid_file)) as second:
        second.inbound()
        assert pid_file.read_text() == f"{second.proc.pid}\n"


def test_honk_reload_with_no_daemon_exits_3(tmp_path):
    out = honk("reload", "--pid-file", str(tmp_path / "honk.pid"))
    assert out.returncode == EXIT_NOT_RUNNING
    assert out.stderr.strip() == f"honk is not running: no lock file at {tmp_path / 'honk.pid'}"


def test_honk_reload_with_a_config_that_does_not_load_asks_for_the_pid_file(tmp_path):
    cfg = tmp_path / "honk.dae"
    write_config(cfg, fallback="no-such-outbound")
    out = honk("reload", "-c", str(cfg))
    assert out.returncode == EXIT_CONFIG
    assert "unknown-outbound" in out.stderr and "pass --pid-file" in out.stderr
