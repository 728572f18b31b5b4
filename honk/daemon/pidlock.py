"""The PID lock file: one running ``honk`` per lock, and a way to signal it.

``honk run`` holds an exclusive ``lockf`` lock on the file for its whole life and
writes its pid into it. The lock, not the file's existence, says whether honk
runs: the kernel drops it when the process dies, however it dies, so a stale
file left by a crash never blocks a start and never gets a signal sent to a
recycled pid. ``honk reload`` reads the pid only after a non-blocking lock
attempt of its own fails, that is while the holder is alive.

``lockf`` locks are POSIX record locks, owned by the process: a second lock
attempt from the same process succeeds, and closing any descriptor of the file
drops the lock. So the holding process must never open the file again: both
:class:`PidLock` and :func:`running_pid` recognise a file this process holds by
``stat`` (device and inode) before opening anything, refuse a second
acquisition, and answer "this process" for a probe.

Release empties the file but leaves it in place: unlinking a lock file races
with a starting instance that has opened the old inode and would then lock a
file nobody else can see.
"""

from __future__ import annotations

import errno
import fcntl
import os
import signal
from pathlib import Path

RUN_DIR = "/run/honk"  # the FHS runtime directory, used when honk runs as root
PID_FILE_NAME = "honk.pid"
PID_FILE_MODE = 0o644  # readable by anyone (honk reload as another user reads the pid)
RUN_DIR_MODE = 0o755
MAX_PID_TEXT = 64  # bytes read from the file: a pid and a newline, with room to spare

# (st_dev, st_ino) of the lock files this process holds; POSIX locks cannot tell us.
_held: set[tuple[int, int]] = set()


class PidLockError(Exception):
    """Base of the PID lock's typed failures."""


class AlreadyRunning(PidLockError):
    """The lock is held: another honk runs with this PID file. ``pid`` is the holder's (or None)."""

    def __init__(self, path: str, pid: int | None) -> None:
        self.path = path
        self.pid = pid
        holder = f"pid {pid}" if pid is not None else "a process that has not written its pid yet"
        super().__init__(f"honk is already running ({holder}; lock file {path})")


class NotRunning(PidLockError):
    """Nothing holds the lock at ``path``; ``reason`` says what was found (and names the path)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"honk is not running: {reason}")


def default_pid_path(data_dir: str | os.PathLike[str]) -> Path:
    """``/run/honk/honk.pid`` for root when /run/honk exists or can be created, else
    ``<data_dir>/honk.pid``."""
    if os.geteuid() == 0:
        try:
            os.makedirs(RUN_DIR, mode=RUN_DIR_MODE, exist_ok=True)
        except OSError:
            pass
        else:
            if os.path.isdir(RUN_DIR):
                return Path(RUN_DIR) / PID_FILE_NAME
    return Path(data_dir) / PID_FILE_NAME


def _read_pid(fd: int) -> int | None:
    os.lseek(fd, 0, os.SEEK_SET)
    text = os.read(fd, MAX_PID_TEXT).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def _held_here(path: str | os.PathLike[str]) -> bool:
    try:
        st = os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) in _held


def _is_contention(exc: OSError) -> bool:
    # lockf reports a held lock as EACCES or EAGAIN depending on the system
    return exc.errno in (errno.EACCES, errno.EAGAIN)


class PidLock:
    """``acquire()`` the lock at ``path`` (raises :class:`AlreadyRunning`), ``release()`` it.

    Also a context manager. The descriptor stays open (close-on-exec) while held.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._fd: int | None = None
        self._key: tuple[int, int] | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        if self._fd is not None:
            raise RuntimeError(f"{self.path}: already held by this PidLock")
        if _held_here(self.path):  # opening it would "succeed" and then drop our lock on close
            raise AlreadyRunning(str(self.path), os.getpid())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PID_FILE_MODE)
        try:
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if not _is_contention(exc):
                    raise
                raise AlreadyRunning(str(self.path), _read_pid(fd)) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        _held.add(key)
        self._fd, self._key = fd, key

    def release(self) -> None:
        """Empty the file and drop the lock; a no-op when not held."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass  # the lock goes with the descriptor anyway
        finally:
            _held.discard(self._key)  # type: ignore[arg-type]
            self._key = None
            os.close(fd)

    def __enter__(self) -> PidLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def running_pid(path: str | os.PathLike[str]) -> int:
    """The pid holding the lock at ``path``; :class:`NotRunning` when nobody holds it."""
    spath = os.fspath(path)
    if _held_here(spath):  # ours: opening it would drop the lock on close
        return os.getpid()
    try:
        fd = os.open(spath, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NotRunning(spath, f"no lock file at {spath}") from None
    try:
        try:
            # a shared lock needs only read access and fails while anyone holds the exclusive one
            fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if not _is_contention(exc):
                raise
        else:
            raise NotRunning(spath, f"nothing holds the lock on {spath}")
        pid = _read_pid(fd)
    finally:
        os.close(fd)  # also drops the shared lock if it was taken
    if pid is None:
        raise NotRunning(spath, f"the lock on {spath} is held but the file names no pid")
    return pid


def signal_running(path: str | os.PathLike[str], sig: int = signal.SIGHUP) -> int:
    """Send ``sig`` to the honk holding the lock at ``path``; return its pid.

    Raises :class:`NotRunning` when the lock is free (or the holder exited meanwhile),
    PermissionError when the holder belongs to another user.
    """
    pid = running_pid(path)
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        raise NotRunning(os.fspath(path), f"pid {pid} (from {os.fspath(path)}) exited") from None
    return pid
