"""The subscription store: the last accepted body of each subscription, for offline starts.

Bodies live in the ``subscription_body`` table of the state database,
``<data_dir>/state/honk.db`` (a 0600 file in a 0700 directory), keyed by
:func:`body_key`. A body is written only after it parsed into at least one
usable node, in one transaction, so a crash never leaves half a body behind.

Limits (upstream subscription reference): a body is at most
:data:`MAX_STORED_BODY` bytes and all bodies together at most
:data:`MAX_STORED_TOTAL`. A write that would pass the total first deletes the
bodies of subscriptions that are no longer configured (``keep`` names the
configured keys); if that is not enough the write is refused
(``subscription-store-write-failed``) and the previous body stays.

:class:`SubscriptionStore` is the only owner of the database connection. Its
methods block (SQLite); they may be called from a worker thread, one at a
time per store, which a lock enforces.
"""

from __future__ import annotations

import base64
import hashlib
import os
import sqlite3
import threading
from collections.abc import Collection, Sequence
from pathlib import Path

from honk.core.errors import HonkError
from honk.core.statedb import create_private_file, state_db_path
from honk.subscription.formats import MAX_BODY_BYTES

__all__ = ["MAX_STORED_BODY", "MAX_STORED_TOTAL", "StoreError", "SubscriptionStore", "body_key", "store_path"]

MAX_STORED_BODY = MAX_BODY_BYTES  # "Each body is at most 8 MiB"
MAX_STORED_TOTAL = 32 * 1024 * 1024  # "all bodies together at most 32 MiB"
KEY_SUFFIX = ".sub"
LENGTH_PREFIX = 8  # bytes: each field of the key material is preceded by its length, big-endian

_SCHEMA = """
CREATE TABLE IF NOT EXISTS subscription_body (
    key TEXT PRIMARY KEY,
    body BLOB NOT NULL,
    stored_at REAL NOT NULL
)
"""


class StoreError(HonkError):
    """The store could not be opened, read or written; ``reason`` is a static slug."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"subscription store: {reason}")
        self.reason = reason


def body_key(url: str, user_agent: str | None, headers: Sequence[tuple[str, str]] = ()) -> str:
    """The store key of a subscription: URL-safe base64 (unpadded) of SHA-256 over the
    length-delimited URL, configured User-Agent override ('' when unset) and ordered
    header pairs, plus ``.sub``.

    The default ``honk/<version>`` User-Agent is not part of it, so an upgrade keeps
    stored bodies; the URL never appears in the key in plain text.
    """
    digest = hashlib.sha256()
    for field in (url, user_agent or "", *(part for pair in headers for part in pair)):
        data = field.encode("utf-8", "surrogatepass")
        digest.update(len(data).to_bytes(LENGTH_PREFIX, "big"))
        digest.update(data)
    return base64.urlsafe_b64encode(digest.digest()).decode("ascii").rstrip("=") + KEY_SUFFIX


store_path = state_db_path  # the bodies share the state database file


class SubscriptionStore:
    """Owner of the ``subscription_body`` table. Open with :meth:`open`; :meth:`close` when done."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self._lock = threading.Lock()
        self.path = path

    @classmethod
    def open(cls, data_dir: str | os.PathLike[str]) -> SubscriptionStore:
        """Create (or reuse) ``<data_dir>/state/honk.db`` with private permissions.

        Raises :class:`StoreError` (``unavailable``) when the directory or file
        cannot be created or opened.
        """
        path = store_path(data_dir)
        try:
            if not create_private_file(path):
                raise StoreError("unavailable")
            conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
            conn.execute(_SCHEMA)
        except (OSError, sqlite3.Error):
            raise StoreError("unavailable") from None
        return cls(conn, path)

    def load(self, key: str) -> bytes | None:
        """The stored body for ``key``, or None. Raises :class:`StoreError` (``read-failed``)."""
        with self._lock:
            try:
                row = self._conn.execute(
                    "SELECT body FROM subscription_body WHERE key = ?", (key,)
                ).fetchone()
            except sqlite3.Error:
                raise StoreError("read-failed") from None
        return bytes(row[0]) if row is not None else None

    def save(self, key: str, body: bytes, now: float, keep: Collection[str] = ()) -> None:
        """Replace the body of ``key`` in one transaction; ``now`` is wall-clock seconds.

        ``keep`` lists the keys of configured subscriptions: when the total would
        pass :data:`MAX_STORED_TOTAL`, bodies of other keys are deleted first.
        Raises :class:`StoreError` (``subscription-store-write-failed``); the
        previous body then stays.
        """
        if len(body) > MAX_STORED_BODY:
            raise StoreError("subscription-store-write-failed")
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    if self._others_size(key) + len(body) > MAX_STORED_TOTAL:
                        self._delete_unkept(set(keep) | {key})
                        if self._others_size(key) + len(body) > MAX_STORED_TOTAL:
                            raise StoreError("subscription-store-write-failed")
                    self._conn.execute(
                        "INSERT OR REPLACE INTO subscription_body (key, body, stored_at) VALUES (?, ?, ?)",
                        (key, body, now),
                    )
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
            except sqlite3.Error:
                raise StoreError("subscription-store-write-failed") from None

    def delete(self, key: str) -> None:
        """Forget the body of ``key`` (a subscription with ``cache: false``)."""
        with self._lock:
            try:
                self._conn.execute("DELETE FROM subscription_body WHERE key = ?", (key,))
            except sqlite3.Error:
                raise StoreError("write-failed") from None

    def keys(self) -> set[str]:
        with self._lock:
            try:
                return {row[0] for row in self._conn.execute("SELECT key FROM subscription_body")}
            except sqlite3.Error:
                raise StoreError("read-failed") from None

    def total_size(self) -> int:
        with self._lock:
            return self._others_size("")

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _others_size(self, key: str) -> int:
        row = self._conn.execute(
            "SELECT COALESCE(SUM(LENGTH(body)), 0) FROM subscription_body WHERE key != ?", (key,)
        ).fetchone()
        return int(row[0])

    def _delete_unkept(self, keep: set[str]) -> None:
        for (key,) in self._conn.execute("SELECT key FROM subscription_body").fetchall():
            if key not in keep:
                self._conn.execute("DELETE FROM subscription_body WHERE key = ?", (key,))
