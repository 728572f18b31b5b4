"""The state database: small facts worth keeping across a restart.

honk keeps one SQLite file, ``<data_dir>/state/honk.db`` (:func:`state_db_path`);
this class owns two of its tables (the subscription store keeps the last
accepted subscription bodies in a third, through its own connection):

* ``node_delay``: the last real TCP delay of each node, by NodeId (GH-E-12: written
  every 60 s, restored at start only if at most 24 hours old; liveness is never
  restored from it, and synthetic placeholders are never written, GH-E-13);
* ``selector_choice``: the member an operator chose for a Selector group, per network.

Everything here is a cache. Losing it costs a few probes or a re-made choice;
failing to start costs the whole router. So a corrupt or unreadable file is
moved aside to ``honk.db.corrupt`` (with its ``-wal``/``-shm`` companions, so a
stale WAL is never replayed into the new file) with a warning, and an empty
database takes its place; if even that fails, this run keeps its state in
memory. Errors while reading or writing are logged and the call does nothing
(loads return nothing), except that corruption found mid-run is handled like
corruption at open and the call is retried once on the fresh file.

The API is synchronous because SQLite blocks: async callers run each call in a
worker thread (``await asyncio.to_thread(db.save_delays, samples)``). One lock
serialises the calls, so any thread may call, one at a time. Other owners of
tables in the same file use their own connection; SQLite's locking and the busy
timeout keep them apart.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import sqlite3
import stat
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

from honk._fast.nodeid import NodeId

__all__ = [
    "DELAY_MAX_AGE",
    "SCHEMA_VERSION",
    "StateDB",
    "corrupt_path",
    "create_private_file",
    "state_db_path",
]

log = logging.getLogger(__name__)

DELAY_MAX_AGE = 24 * 3600.0  # restored only if at most 24 hours old
SCHEMA_VERSION = 1  # PRAGMA user_version of the layout in _SCHEMA
CORRUPT_SUFFIX = ".corrupt"  # an unusable file is kept next to the new one under this suffix
COMPANIONS = ("-wal", "-shm")  # SQLite's WAL-mode side files, moved together with the main file
STATE_DIR_NAME = "state"  # <data_dir>/state/honk.db
STATE_FILE_NAME = "honk.db"
DIR_MODE = 0o700  # directories created for the file are private
FILE_MODE = 0o600  # node ids and choices are nobody else's business
BUSY_TIMEOUT = 1.0  # seconds SQLite waits for a lock held by another connection before failing

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS node_delay (
        node_id TEXT PRIMARY KEY,
        delay REAL NOT NULL,
        measured_at REAL NOT NULL
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS selector_choice (
        group_name TEXT NOT NULL,
        network TEXT NOT NULL,
        member TEXT NOT NULL,
        PRIMARY KEY (group_name, network)
    ) WITHOUT ROWID""",
)

_CORRUPT_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
_BUSY_CODES = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})

T = TypeVar("T")


class _Unusable(Exception):
    """The file opened but cannot be used as this database (``reason``: a short word)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def state_db_path(data_dir: str | os.PathLike[str]) -> Path:
    """Where the state database lives under ``data_dir``."""
    return Path(data_dir) / STATE_DIR_NAME / STATE_FILE_NAME


def create_private_file(path: Path) -> bool:
    """Create ``path`` (and its directory) private before SQLite opens it, so there is no
    moment where it is readable by others; False when it exists but is not a regular file.
    Raises OSError when it cannot be created."""
    path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    os.chmod(path.parent, DIR_MODE)  # mkdir's mode is masked by the umask
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return False
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    return True


def corrupt_path(path: str | os.PathLike[str]) -> Path:
    """Where an unusable database at ``path`` is moved to."""
    path = Path(path)
    return path.with_name(path.name + CORRUPT_SUFFIX)


def _primary_code(error: sqlite3.Error) -> int | None:
    code = getattr(error, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def _describe(error: BaseException) -> str:
    """A short word for a log line: SQLite's error name, the errno name, or our reason."""
    if isinstance(error, _Unusable):
        return error.reason
    if isinstance(error, sqlite3.Error):
        return getattr(error, "sqlite_errorname", None) or type(error).__name__
    if isinstance(error, OSError) and error.errno is not None:
        return os.strerror(error.errno)
    return type(error).__name__


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def _transaction(conn: sqlite3.Connection, work: Callable[[sqlite3.Connection], object]) -> None:
    conn.execute("BEGIN IMMEDIATE")
    try:
        work(conn)
    except BaseException:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # the original error says more
        raise
    conn.execute("COMMIT")


def _prepare(conn: sqlite3.Connection) -> None:
    """WAL, an integrity check, the schema-version check and the tables."""
    conn.execute("PRAGMA journal_mode=WAL")  # an in-memory database stays "memory": fine
    conn.execute("PRAGMA synchronous=NORMAL")  # a cache: losing the last commit on power loss is fine
    problems = [row[0] for row in conn.execute("PRAGMA quick_check")]
    if problems != ["ok"]:
        raise _Unusable("integrity-check-failed")
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    if version not in (0, SCHEMA_VERSION):
        raise _Unusable("unknown-schema-version")

    def create(c: sqlite3.Connection) -> None:
        for statement in _SCHEMA:
            c.execute(statement)
        c.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    _transaction(conn, create)


class StateDB:
    """The delay and Selector-choice tables in one SQLite file. See the module docstring.

    ``persistent`` is False when the file could not be used and state lives in
    memory for this run.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.persistent = False
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = self._open()

    # --- delays (GH-E-12) ------------------------------------------------------

    def save_delays(self, samples: Mapping[uuid.UUID, tuple[float, float]]) -> None:
        """Upsert ``{node_id: (delay seconds, wall-clock unix seconds measured)}`` in one transaction.

        Raises ValueError for a delay that is negative or not finite, or a
        non-finite time (a caller's bug; nothing is written then).
        """
        rows = []
        for node_id, (delay, measured_at) in samples.items():
            if not isinstance(node_id, uuid.UUID):
                raise TypeError("node ids are uuid.UUID")
            if not (math.isfinite(delay) and delay >= 0 and math.isfinite(measured_at)):
                raise ValueError("a delay sample must be a finite, non-negative delay at a finite time")
            rows.append((str(node_id), float(delay), float(measured_at)))
        if not rows:
            return

        def write(conn: sqlite3.Connection) -> None:
            conn.executemany(
                "INSERT INTO node_delay (node_id, delay, measured_at) VALUES (?, ?, ?) "
                "ON CONFLICT (node_id) DO UPDATE SET delay = excluded.delay, measured_at = excluded.measured_at",
                rows,
            )

        self._run("save-delays", lambda conn: _transaction(conn, write), None)

    def load_delays(
        self, now_wall: float, max_age: float = DELAY_MAX_AGE
    ) -> dict[uuid.UUID, tuple[float, float]]:
        """Samples measured at most ``max_age`` seconds before ``now_wall``: ``{node_id: (delay, measured_at)}``."""

        def read(conn: sqlite3.Connection) -> dict[uuid.UUID, tuple[float, float]]:
            out: dict[uuid.UUID, tuple[float, float]] = {}
            rows = conn.execute(
                "SELECT node_id, delay, measured_at FROM node_delay WHERE measured_at >= ?",
                (now_wall - max_age,),
            )
            for node_id, delay, measured_at in rows:
                try:
                    key = NodeId(node_id)
                except (TypeError, ValueError, AttributeError):
                    continue  # not written by us; ignore rather than fail the whole load
                if isinstance(delay, float) and math.isfinite(delay) and delay >= 0:
                    out[key] = (delay, float(measured_at))
            return out

        return self._run("load-delays", read, {})

    def forget(self, node_ids: Iterable[uuid.UUID]) -> None:
        """Drop the stored delays of these nodes (removed from the configuration)."""
        keys = [(str(node_id),) for node_id in node_ids]
        if not keys:
            return
        self._run(
            "forget-delays",
            lambda conn: _transaction(
                conn, lambda c: c.executemany("DELETE FROM node_delay WHERE node_id = ?", keys)
            ),
            None,
        )

    # --- Selector choices ----------------------------------------------------------

    def save_choice(self, group: str, network: str, member: str) -> None:
        """Remember that ``group`` uses ``member`` for ``network``."""
        self._run(
            "save-choice",
            lambda conn: conn.execute(
                "INSERT INTO selector_choice (group_name, network, member) VALUES (?, ?, ?) "
                "ON CONFLICT (group_name, network) DO UPDATE SET member = excluded.member",
                (group, network, member),
            ),
            None,
        )

    def load_choices(self) -> dict[str, dict[str, str]]:
        """Every stored choice: ``{group: {network: member}}``."""

        def read(conn: sqlite3.Connection) -> dict[str, dict[str, str]]:
            out: dict[str, dict[str, str]] = {}
            for group, network, member in conn.execute(
                "SELECT group_name, network, member FROM selector_choice"
            ):
                out.setdefault(group, {})[network] = member
            return out

        return self._run("load-choices", read, {})

    def forget_choice(self, group: str, network: str) -> None:
        self._run(
            "forget-choice",
            lambda conn: conn.execute(
                "DELETE FROM selector_choice WHERE group_name = ? AND network = ?", (group, network)
            ),
            None,
        )

    # --- lifetime ------------------------------------------------------------------

    def close(self) -> None:
        """Close the file (a checkpoint folds the WAL back in). Idempotent."""
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is not None:
                try:
                    conn.close()
                except sqlite3.Error as e:
                    log.warning("state database: close failed (%s)", _describe(e))

    def __enter__(self) -> StateDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals -----------------------------------------------------------------

    def _run(self, what: str, action: Callable[[sqlite3.Connection], T], fallback: T) -> T:
        with self._lock:
            if self._conn is None:
                raise RuntimeError("the state database is closed")
            try:
                return action(self._conn)
            except (sqlite3.ProgrammingError, sqlite3.InterfaceError):
                raise  # our bug, not the file's
            except sqlite3.Error as e:
                if _primary_code(e) not in _CORRUPT_CODES:
                    log.warning("state database: %s failed (%s); skipped", what, _describe(e))
                    return fallback
                self._replace_corrupt(e)
            try:
                return action(self._conn)
            except sqlite3.Error as e:
                log.warning(
                    "state database: %s failed again on the fresh file (%s); skipped", what, _describe(e)
                )
                return fallback

    def _replace_corrupt(self, cause: sqlite3.Error) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        if self.persistent and self._move_aside(cause):
            self._conn = self._open_file_or_memory()
        else:
            self._conn = self._open_memory()

    def _open(self) -> sqlite3.Connection:
        try:
            return self._open_file()
        except (OSError, sqlite3.Error, _Unusable) as e:
            if isinstance(e, sqlite3.Error) and _primary_code(e) in _BUSY_CODES:
                log.warning(
                    "state database %s is locked by another user (%s); keeping state in memory",
                    self.path,
                    _describe(e),
                )
                return self._open_memory()
            if not self._move_aside(e):
                return self._open_memory()
        return self._open_file_or_memory()

    def _open_file_or_memory(self) -> sqlite3.Connection:
        try:
            return self._open_file()
        except (OSError, sqlite3.Error, _Unusable) as e:
            log.warning(
                "state database %s cannot be created (%s); keeping state in memory for this run",
                self.path,
                _describe(e),
            )
            return self._open_memory()

    def _open_file(self) -> sqlite3.Connection:
        self.persistent = False
        if not create_private_file(self.path):
            raise _Unusable("not-a-regular-file")
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False)
        try:
            _prepare(conn)
        except BaseException:
            conn.close()
            raise
        self.persistent = True
        return conn

    def _open_memory(self) -> sqlite3.Connection:
        self.persistent = False
        conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        _prepare(conn)
        return conn

    def _move_aside(self, cause: BaseException) -> bool:
        """Move the unusable file and its companions to ``*.corrupt``; False when nothing could be moved."""
        if not os.path.lexists(self.path):
            log.warning(
                "state database %s cannot be created (%s); keeping state in memory for this run",
                self.path,
                _describe(cause),
            )
            return False
        target = corrupt_path(self.path)
        try:
            for suffix in ("", *COMPANIONS):
                source, dest = Path(f"{self.path}{suffix}"), Path(f"{target}{suffix}")
                _remove(dest)
                if os.path.lexists(source):
                    os.replace(source, dest)
        except OSError as e:
            log.warning(
                "state database %s is unusable (%s) and cannot be moved aside (%s); "
                "keeping state in memory for this run",
                self.path,
                _describe(cause),
                _describe(e),
            )
            return False
        log.warning(
            "state database %s is unusable (%s); moved it to %s and started an empty one",
            self.path,
            _describe(cause),
            target,
        )
        return True
