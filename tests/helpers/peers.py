"""Real peer programs: required in CI, skippable on a developer's machine."""

from __future__ import annotations

import os
import shutil
import socket

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def require_binary(name: str) -> str:
    """Path of ``name``; with CI=true a missing peer fails the test instead of skipping it."""
    path = shutil.which(name)
    if path:
        return path
    if IN_CI:
        pytest.fail(f"{name} is required in CI; `make peers` installs it")
    pytest.skip(f"{name} is not installed (a missing peer skips only outside CI)")


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
