"""Real peer programs: required in CI, skippable on a developer's machine."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"
CURL_MAX_TIME = 5  # seconds: curl's own bound on one request through a proxy on loopback


def require_binary(name: str) -> str:
    """Path of ``name``; with CI=true a missing peer fails the test instead of skipping it."""
    path = shutil.which(name)
    if path:
        return path
    if IN_CI:
        pytest.fail(f"{name} is required in CI; `make peers` installs it")
    pytest.skip(f"{name} is not installed (a missing peer skips only outside CI)")


def require_root(what: str) -> None:
    """Root (CAP_NET_ADMIN) for ``what``; with CI=true its absence fails the test instead of skipping."""
    if os.geteuid() == 0:
        return
    if IN_CI:
        pytest.fail(f"{what} need root (CAP_NET_ADMIN) in CI")
    pytest.skip(f"{what} need root (CAP_NET_ADMIN); they run in CI")


def free_tcp_udp_port(host: str = "127.0.0.1", attempts: int = 20) -> int:
    """A port free for both TCP and UDP on ``host`` right now (Shadowsocks serves both on one port)."""
    for _ in range(attempts):
        with socket.socket() as tcp:
            tcp.bind((host, 0))
            port = tcp.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind((host, port))
                except OSError:
                    continue
                return port
    raise OSError(f"no port free for both TCP and UDP on {host} after {attempts} tries")


async def curl(*args: str) -> tuple[int, str, str]:
    """curl ``args`` quietly with a bounded run time and a clean environment (no proxy variables):
    (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        require_binary("curl"), "-sS", "--max-time", str(CURL_MAX_TIME), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")},
    )
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()
