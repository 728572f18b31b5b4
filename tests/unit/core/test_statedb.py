"""StateDB on a real SQLite file in tmp_path: persistence, the 24-hour restore window,
corrupt and unreadable files moved aside, the in-memory fallback, and Selector choices."""

import asyncio
import logging
import math
import sqlite3
import stat
import uuid

import pytest

from honk.core.statedb import DELAY_MAX_AGE, SCHEMA_VERSION, StateDB, corrupt_path

NOW = 1_700_000_000.0
A, B, C = (uuid.UUID(int=n) for n in (1, 2, 3))


@pytest.fixture
def path(tmp_path):
    return tmp_path / "data" / "state.db"


def _moved_aside_warning(caplog) -> bool:
    return any(r.levelno == logging.WARNING and "moved it to" in r.getMessage() for r in caplog.records)


def test_delays_survive_close_and_reopen(path):
    with StateDB(path) as db:
        assert db.persistent
        db.save_delays({A: (0.120, NOW - 10), B: (0.045, NOW - 20)})
    with StateDB(path) as db:
        assert db.load_delays(NOW) == {A: (0.120, NOW - 10), B: (0.045, NOW - 20)}


def test_the_file_is_wal_mode_with_a_schema_version(path):
    StateDB(path).close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 1


def test_parent_directories_are_created_and_the_file_is_private(path):
    StateDB(path).close()
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_newer_sample_replaces_the_stored_one(path):
    with StateDB(path) as db:
        db.save_delays({A: (0.300, NOW - 100)})
        db.save_delays({A: (0.050, NOW - 5), C: (0.070, NOW - 6)})
        assert db.load_delays(NOW) == {A: (0.050, NOW - 5), C: (0.070, NOW - 6)}


def test_a_sample_23h59m_old_is_restored_and_one_24h_and_1s_old_is_not(path):
    assert DELAY_MAX_AGE == 24 * 3600.0
    with StateDB(path) as db:
        db.save_delays(
            {
                A: (0.1, NOW - (23 * 3600 + 59 * 60)),
                B: (0.2, NOW - (24 * 3600 + 1)),
                C: (0.3, NOW - 24 * 3600),  # exactly 24 hours: "at most 24 hours old"
            }
        )
    with StateDB(path) as db:
        assert db.load_delays(NOW) == {A: (0.1, NOW - 86340), C: (0.3, NOW - 86400)}
        assert db.load_delays(NOW, max_age=60.0) == {}


def test_forget_drops_only_the_named_nodes(path):
    with StateDB(path) as db:
        db.save_delays({A: (0.1, NOW), B: (0.2, NOW), C: (0.3, NOW)})
        db.forget([A, C])
        db.forget([])
    with StateDB(path) as db:
        assert db.load_delays(NOW) == {B: (0.2, NOW)}


@pytest.mark.parametrize(
    "bad",
    [(math.nan, NOW), (-0.1, NOW), (math.inf, NOW), (0.1, math.nan)],
    ids=["nan-delay", "negative-delay", "infinite-delay", "nan-time"],
)
def test_an_invalid_sample_is_refused_and_nothing_of_the_batch_is_written(path, bad):
    with StateDB(path) as db:
        db.save_delays({A: (0.1, NOW)})
        with pytest.raises(ValueError):
            db.save_delays({A: (0.9, NOW), B: bad})
        assert db.load_delays(NOW) == {A: (0.1, NOW)}


def test_garbage_file_is_moved_aside_with_a_warning_and_an_empty_database_replaces_it(path, caplog):
    path.parent.mkdir(parents=True)
    garbage = b"this is not an SQLite database\n" * 200
    path.write_bytes(garbage)
    with caplog.at_level(logging.WARNING, logger="honk.core.statedb"):
        db = StateDB(path)
    assert _moved_aside_warning(caplog)
    assert corrupt_path(path) == path.with_name("state.db.corrupt")
    assert corrupt_path(path).read_bytes() == garbage
    with db:
        assert db.persistent
        assert db.load_delays(NOW) == {}
        db.save_delays({A: (0.1, NOW)})
    with StateDB(path) as db:
        assert db.load_delays(NOW) == {A: (0.1, NOW)}


def test_a_damaged_page_fails_the_integrity_check_and_the_file_is_moved_aside(path, caplog):
    with StateDB(path) as db:
        db.save_delays({uuid.UUID(int=n): (0.1, NOW) for n in range(1, 3000)})
    page_size = 4096
    with open(path, "r+b") as f:  # keep the header (page 1) valid, wreck the next pages
        f.seek(page_size)
        f.write(b"\xa5" * page_size * 3)
    with caplog.at_level(logging.WARNING, logger="honk.core.statedb"):
        db = StateDB(path)
    with db:
        assert _moved_aside_warning(caplog)
        assert corrupt_path(path).exists()
        assert db.persistent and db.load_delays(NOW) == {}


def test_a_stale_wal_moves_aside_with_the_unusable_file_and_is_not_replayed(path, tmp_path):
    # A real WAL full of rows, captured while its writer still had it open (no checkpoint yet).
    donor = tmp_path / "donor.db"
    writer = sqlite3.connect(donor, isolation_level=None)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("CREATE TABLE node_delay (node_id TEXT PRIMARY KEY, delay REAL, measured_at REAL)")
    writer.execute("INSERT INTO node_delay VALUES (?, 0.5, ?)", (str(A), NOW))
    stale_wal = (tmp_path / "donor.db-wal").read_bytes()
    writer.close()
    assert len(stale_wal) > 32

    path.mkdir(parents=True)  # unusable: moved aside, and a new file is created in its place
    path.with_name("state.db-wal").write_bytes(stale_wal)
    with StateDB(path) as db:
        assert db.persistent
        assert db.load_delays(NOW) == {}
        db.save_delays({B: (0.1, NOW)})
    with StateDB(path) as db:
        assert db.load_delays(NOW) == {B: (0.1, NOW)}
    assert path.with_name("state.db.corrupt-wal").read_bytes() == stale_wal


def test_a_directory_in_place_of_the_file_is_moved_aside(path, caplog):
    path.mkdir(parents=True)
    (path / "leftover").write_text("x")
    with caplog.at_level(logging.WARNING, logger="honk.core.statedb"):
        db = StateDB(path)
    with db:
        assert _moved_aside_warning(caplog)
        assert (corrupt_path(path) / "leftover").read_text() == "x"
        assert db.persistent and path.is_file()


def test_an_unknown_schema_version_is_moved_aside(path, caplog):
    StateDB(path).close()
    with sqlite3.connect(path) as raw:
        raw.execute("PRAGMA user_version = 99")
    with caplog.at_level(logging.WARNING, logger="honk.core.statedb"):
        db = StateDB(path)
    with db:
        assert _moved_aside_warning(caplog)
        assert "unknown-schema-version" in caplog.text
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_an_uncreatable_location_keeps_state_in_memory_with_a_warning(tmp_path, caplog):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the data directory should be")
    with caplog.at_level(logging.WARNING, logger="honk.core.statedb"):
        db = StateDB(blocker / "state.db")
    with db:
        assert not db.persistent
        assert "keeping state in memory" in caplog.text
        db.save_delays({A: (0.1, NOW)})
        db.save_choice("proxy", "tcp", "hk-1")
        assert db.load_delays(NOW) == {A: (0.1, NOW)}
        assert db.load_choices() == {"proxy": {"tcp": "hk-1"}}


class _CorruptingConnection:
    """Stands in for the live connection and fails like SQLite does on a malformed page."""

    def __init__(self, real: sqlite3.Connection) -> None:
        self.real = real

    def execute(self, *args, **kwargs):
        error = sqlite3.DatabaseError("database disk image is malformed")
        error.sqlite_errorcode = sqlite3.SQLITE_CORRUPT
        raise error

    executemany = execute

    def close(self) -> None:
        self.real.close()


def test_corruption_found_mid_run_moves_the_file_aside_and_retries_the_save(path, caplog):
    db = StateDB(path)
    db.save_delays({A: (0.1, NOW)})
    db._conn = _CorruptingConnection(db._conn)
    with caplog.at_level(logging.WARNING, logger="honk.core.statedb"):
        db.save_delays({B: (0.2, NOW)})
    assert _moved_aside_warning(caplog)
    assert db.load_delays(NOW) == {B: (0.2, NOW)}  # A went with the corrupt file
    db.close()
    with StateDB(path) as again:
        assert again.load_delays(NOW) == {B: (0.2, NOW)}


def test_choices_round_trip_and_forget(path):
    with StateDB(path) as db:
        db.save_choice("proxy", "tcp", "hk-1")
        db.save_choice("proxy", "udp", "jp-2")
        db.save_choice("streaming", "tcp", "us-1")
        db.save_choice("proxy", "tcp", "sg-3")  # replaces hk-1
    with StateDB(path) as db:
        assert db.load_choices() == {"proxy": {"tcp": "sg-3", "udp": "jp-2"}, "streaming": {"tcp": "us-1"}}
        db.forget_choice("proxy", "udp")
        db.forget_choice("missing", "tcp")
        assert db.load_choices() == {"proxy": {"tcp": "sg-3"}, "streaming": {"tcp": "us-1"}}


async def test_calls_from_worker_threads_work(path):
    db = StateDB(path)
    try:
        await asyncio.gather(
            *(asyncio.to_thread(db.save_delays, {uuid.UUID(int=n): (n / 1000, NOW)}) for n in range(1, 21))
        )
        loaded = await asyncio.to_thread(db.load_delays, NOW)
        assert loaded == {uuid.UUID(int=n): (n / 1000, NOW) for n in range(1, 21)}
    finally:
        await asyncio.to_thread(db.close)


def test_close_is_idempotent_and_a_closed_database_refuses_calls(path):
    db = StateDB(path)
    db.close()
    db.close()
    with pytest.raises(RuntimeError):
        db.load_delays(NOW)
