"""BPF for tests: the capability check, a private bpffs, the compiled classifier, and running
code inside a network namespace (a thread that joined it)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest

from helpers.peers import IN_CI, require_binary, require_root
from honk._fast import bpfmap_py

CLONE_NEWNET = 0x40000000
T = TypeVar("T")
_libc = ctypes.CDLL(None, use_errno=True)


def require_bpf(what: str) -> None:
    """Root and a working bpf(2); with CI=true their absence fails instead of skipping."""
    require_root(what)
    try:
        os.close(bpfmap_py.map_create(bpfmap_py.BPF_MAP_TYPE_ARRAY, 4, 8, 1, b"honk_probe"))
    except OSError as exc:
        reason = f"{what} need bpf(2): {exc.strerror} (kernel.unprivileged_bpf_disabled, CAP_BPF)"
        (pytest.fail if IN_CI else pytest.skip)(reason)  # with CI=true a missing bpf(2) fails, never skips


@contextlib.contextmanager
def private_bpffs(base: Path) -> Iterator[Path]:
    """A bpffs mounted at ``base/bpffs`` for one test (the host's /sys/fs/bpf is left alone);
    yields a pin directory on it."""
    mount_point = base / "bpffs"
    mount_point.mkdir()
    subprocess.run(["mount", "-t", "bpf", "bpf", str(mount_point)], check=True)
    try:
        yield mount_point / "honk"
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def classifier_object(base: Path) -> Path:
    """The classifier `make build` compiled, else one compiled now with clang."""
    built = Path(__file__).resolve().parents[2] / "honk" / "ebpf" / "datapath.bpf.o"
    source = built.with_name("datapath.bpf.c")
    if built.is_file() and built.stat().st_mtime >= source.stat().st_mtime:
        return built
    clang = require_binary("clang")
    triplet = subprocess.run(
        ["gcc", "-dumpmachine"], capture_output=True, text=True, check=True
    ).stdout.strip()
    out = base / "datapath.bpf.o"
    subprocess.run(
        [
            clang,
            "-O2",
            "-g",
            "-target",
            "bpf",
            f"-I/usr/include/{triplet}",
            "-c",
            str(source),
            "-o",
            str(out),
        ],
        check=True,
    )
    return out


def in_netns(name: str, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` on a thread that joined network namespace ``name``: sockets it creates
    and netlink it does belong there (the thread ends with the call)."""

    def run() -> T:
        fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns {name}: {os.strerror(err)}")
        finally:
            os.close(fd)
        return fn(*args)

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result()
