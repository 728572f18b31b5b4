"""A scratch network namespace for tests of kernel state honk owns (nftables, policy routing)."""

from __future__ import annotations

import contextlib
import subprocess
import uuid
from collections.abc import Iterator

from helpers.peers import require_binary, require_root


@contextlib.contextmanager
def scratch_netns(what: str, *binaries: str) -> Iterator[str]:
    """A fresh namespace, deleted on exit; ``what`` names the tests for the root requirement,
    ``binaries`` are the peers they run (with CI=true, missing ones fail)."""
    require_root(what)
    for binary in ("ip", *binaries):
        require_binary(binary)
    name = f"hk-{uuid.uuid4().hex[:10]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)
