"""Run out of file descriptors on purpose, in this process, and get them back.

``descriptors_exhausted()`` lowers the soft ``RLIMIT_NOFILE`` to a little above the highest
descriptor open now and fills what is left with ``/dev/null``, so the next ``accept``,
``socket`` or ``open`` fails with ``EMFILE``, as it does in a daemon a connection burst has
drained; on exit the fillers close and the limit is put back. Sockets a test needs while
exhausted (a client that connects into a listener's backlog) must be created before.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
from collections.abc import Iterator

HEADROOM = 64  # descriptors above the highest open one the lowered limit allows (then filled)


def open_descriptors() -> list[int]:
    return [int(name) for name in os.listdir("/proc/self/fd")]


@contextlib.contextmanager
def descriptors_exhausted(spare: int = 0) -> Iterator[int]:
    """Every descriptor this process may still open but ``spare`` is taken until exit; yields how
    many fillers (one spare lets a ``dup`` through while a ``pipe``, which needs two, fails)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(open_descriptors()) + HEADROOM, hard))
    fillers: list[int] = []
    try:
        while True:
            try:
                fillers.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
            except OSError as exc:
                if exc.errno != errno.EMFILE:
                    raise
                break
        for _ in range(min(spare, len(fillers))):
            os.close(fillers.pop())
        yield len(fillers)
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
