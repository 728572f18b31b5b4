"""The subscription store on a real SQLite file: round trip, permissions, keys and limits."""

from __future__ import annotations

import base64
import hashlib
import os
import sqlite3
import stat

import pytest

from honk.subscription.store import (
    MAX_STORED_BODY,
    MAX_STORED_TOTAL,
    StoreError,
    SubscriptionStore,
    body_key,
    store_path,
)

URL = "https://sub.example/api?token=s3cretPW"
MIB = 1024 * 1024


@pytest.fixture
def store(tmp_path):
    s = SubscriptionStore.open(tmp_path)
    yield s
    s.close()


def test_a_saved_body_survives_closing_and_reopening_the_database(tmp_path):
    key = body_key(URL, None)
    first = SubscriptionStore.open(tmp_path)
    first.save(key, b"socks5://h.example:1080\n", now=1.0)
    first.close()
    again = SubscriptionStore.open(tmp_path)
    try:
        assert again.load(key) == b"socks5://h.example:1080\n"
        assert again.load(body_key(URL, "other-agent")) is None
    finally:
        again.close()
    assert store_path(tmp_path) == tmp_path / "state" / "honk.db"


def test_the_database_is_a_private_file_in_a_private_directory(tmp_path):
    old = os.umask(0o022)
    try:
        SubscriptionStore.open(tmp_path).close()
    finally:
        os.umask(old)
    db = store_path(tmp_path)
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    with sqlite3.connect(db) as conn:  # the documented table, readable by other tools
        assert conn.execute("SELECT COUNT(*) FROM subscription_body").fetchone() == (0,)


def test_existing_loose_permissions_are_tightened_on_open(tmp_path):
    db = store_path(tmp_path)
    db.parent.mkdir(mode=0o755)
    db.touch(mode=0o644)
    os.chmod(db.parent, 0o755)
    os.chmod(db, 0o644)
    SubscriptionStore.open(tmp_path).close()
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(db.stat().st_mode) == 0o600


def test_a_symlinked_database_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere.db"
    elsewhere.touch()
    db = store_path(tmp_path / "data")
    db.parent.mkdir(parents=True)
    db.symlink_to(elsewhere)
    with pytest.raises(StoreError) as info:
        SubscriptionStore.open(tmp_path / "data")
    assert info.value.reason == "unavailable"


def test_the_key_is_urlsafe_base64_of_sha256_over_length_delimited_fields():
    material = b""
    for field in (URL.encode(), b""):
        material += len(field).to_bytes(8, "big") + field
    expected = base64.urlsafe_b64encode(hashlib.sha256(material).digest()).decode().rstrip("=") + ".sub"
    assert body_key(URL, None) == expected
    assert body_key(URL, "") == expected  # an empty override is no override
    assert "s3cretPW" not in expected and "sub.example" not in expected


def test_the_key_depends_on_the_user_agent_and_headers_and_is_not_ambiguous():
    keys = {
        body_key(URL, None),
        body_key(URL, "clash"),
        body_key(URL, None, [("X-Token", "a")]),
        body_key("ab", "c"),
        body_key("a", "bc"),  # same concatenation, different fields
    }
    assert len(keys) == 5


def test_a_body_over_eight_mebibytes_is_refused_and_the_previous_body_stays(store):
    key = body_key(URL, None)
    store.save(key, b"previous", now=1.0)
    with pytest.raises(StoreError) as info:
        store.save(key, b"x" * (MAX_STORED_BODY + 1), now=2.0)
    assert info.value.reason == "subscription-store-write-failed"
    assert store.load(key) == b"previous"


def test_a_write_past_the_total_first_evicts_bodies_of_unconfigured_subscriptions(store):
    kept, new, *gone = (body_key(f"https://{n}.example/", None) for n in ("kept", "new", "a", "b", "c"))
    for key in (kept, *gone):  # 4 x 8 MiB: the store is full
        store.save(key, b"k" * (8 * MIB), now=1.0)
    assert store.total_size() == MAX_STORED_TOTAL
    store.save(new, b"n" * (8 * MIB), now=2.0, keep={kept, new})
    assert store.keys() == {kept, new}
    assert store.load(kept) == b"k" * (8 * MIB)


def test_a_write_that_cannot_fit_even_after_eviction_is_refused_and_keeps_the_old_body(store):
    keys = [body_key(f"https://{i}.example/", None) for i in range(5)]
    for key in keys[:4]:
        store.save(key, b"x" * (8 * MIB), now=1.0, keep=keys)
    store.save(keys[0], b"small", now=2.0, keep=keys)  # replacing a body counts its new size only
    with pytest.raises(StoreError):
        store.save(keys[4], b"y" * (8 * MIB), now=3.0, keep=keys)
    assert store.load(keys[4]) is None
    assert store.load(keys[0]) == b"small"
    assert store.total_size() == 3 * 8 * MIB + len(b"small")


def test_delete_forgets_a_body(store):
    key = body_key(URL, None)
    store.save(key, b"body", now=1.0)
    store.delete(key)
    assert store.load(key) is None
