"""Real peer programs: required in CI, skippable on a developer's machine."""

from __future__ import annotations

import asyncio
import importlib
import os
import shutil
import socket

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"
# the compiled kernels must be in use: asked for by the build (make test), or in CI unless the run
# is the twins' (HONK_NO_EXTENSIONS); elsewhere a dev install may lack them and the check skips
COMPILED_REQUIRED = bool(os.environ.get("HONK_REQUIRE_EXTENSIONS")) or (
    IN_CI and not os.environ.get("HONK_NO_EXTENSIONS")
)
CURL_MAX_TIME = 5  # seconds: curl's own bound on one request through a proxy on loopback


def require(present: bool, what: str, ci_message: str | None = None) -> None:
    """Go on when ``present``; else fail with CI=true (CI provides every peer) and skip elsewhere."""
    if present:
        return
    if IN_CI:
        pytest.fail(ci_message or f"{what}: required in CI")
    pytest.skip(f"{what} (a missing peer skips only outside CI)")


def require_binary(name: str) -> str:
    """Path of ``name``; with CI=true a missing peer fails the test instead of skipping it."""
    path = shutil.which(name)
    require(
        path is not None,
        f"{name} is not installed",
        ci_message=f"{name} is required in CI; `make peers` installs it",
    )
    return path  # type: ignore[return-value]


def require_root(what: str) -> None:
    """Root (CAP_NET_ADMIN) for ``what``; with CI=true its absence fails the test instead of skipping."""
    require(os.geteuid() == 0, f"{what} need root (CAP_NET_ADMIN)")


def has_ipv6_loopback() -> bool:
    """Whether ``::1`` can be bound here."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def require_ipv6_loopback() -> None:
    require(has_ipv6_loopback(), "this machine has no IPv6 loopback (::1)")


def require_module(name: str):  # noqa: ANN201 - the module
    """Import ``name`` (a test dependency of ``pip install -e .[test]``), as ``require`` does."""
    try:
        return importlib.import_module(name)
    except ImportError:
        require(False, f"the Python module {name} is not installed")


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
        require_binary("curl"),
        "-sS",
        "--max-time",
        str(CURL_MAX_TIME),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")},
    )
    out, err = await proc.communicate()
    return proc.returncode or 0, out.decode(), err.decode()
