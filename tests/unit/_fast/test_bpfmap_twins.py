"""The raw bpf(2) map module: the compiled one and its ctypes twin read and write the same
kernel map identically and fail with the same errors (root and bpf(2) needed)."""

from __future__ import annotations

import errno
import importlib
import os
import struct

import pytest
from helpers.bpf import private_bpffs, require_bpf
from hypothesis import given, settings
from hypothesis import strategies as st

from honk._fast import NO_EXTENSIONS, bpfmap_py

SLOTS = 64
U64_MAX = 2**64 - 1


def load(kernel: str, impl: str):
    """One implementation; a missing compiled build fails the test (as the other kernels' tests)."""
    return importlib.import_module(f"honk._fast.{kernel}_{impl}")


NAMES = ["py"] if NO_EXTENSIONS else ["py", "c"]  # the twin run has no compiled module to compare
IMPLS = [pytest.param(n, id=n, marks=[pytest.mark.compiled] if n == "c" else []) for n in NAMES]
IMPL_PAIRS = [
    pytest.param(w, r, id=f"{w}-writes-{r}-reads", marks=[pytest.mark.compiled] if "c" in (w, r) else [])
    for w in NAMES
    for r in NAMES
]


@pytest.fixture
def array_fd():
    require_bpf("bpf map tests")
    fd = bpfmap_py.map_create(bpfmap_py.BPF_MAP_TYPE_ARRAY, 4, 8, SLOTS, b"honk_twins")
    yield fd
    os.close(fd)


@pytest.mark.parametrize(("writer", "reader"), IMPL_PAIRS)
def test_a_slot_written_by_one_implementation_reads_the_same_in_the_other(array_fd, writer, reader):
    w, r = load("bpfmap", writer).SlotMap(array_fd), load("bpfmap", reader).SlotMap(array_fd)

    @settings(max_examples=60, deadline=None)
    @given(slot=st.integers(0, SLOTS - 1), value=st.integers(0, U64_MAX))
    def check(slot, value):
        w.set(slot, value)
        assert r.get(slot) == value
        raw = load("bpfmap", reader).map_lookup(array_fd, struct.pack("=I", slot), 8)
        assert raw == struct.pack("=Q", value)

    check()


@pytest.mark.parametrize("impl", IMPLS)
def test_errors_carry_the_kernels_errno_and_the_same_text(array_fd, impl):
    mod = load("bpfmap", impl)
    slots = mod.SlotMap(array_fd)
    with pytest.raises(OSError) as missing:
        slots.get(SLOTS)
    assert missing.value.errno == errno.ENOENT
    assert str(missing.value) == str(bpfmap_py.bpf_error(errno.ENOENT, bpfmap_py.BPF_MAP_LOOKUP_ELEM))
    with pytest.raises(OSError) as too_big:
        slots.set(SLOTS, 1)
    assert too_big.value.errno == errno.E2BIG
    with pytest.raises(OSError) as no_delete:
        mod.map_delete(array_fd, struct.pack("=I", 0))  # arrays cannot delete
    assert no_delete.value.errno == errno.EINVAL
    with pytest.raises(OverflowError):
        slots.set(-1, 0)
    with pytest.raises(OSError) as bad_fd:
        mod.SlotMap(-1).get(0)
    assert bad_fd.value.errno == errno.EBADF


@pytest.mark.parametrize("impl", IMPLS)
def test_a_hash_map_is_updated_looked_up_and_deleted_by_raw_key(impl):
    require_bpf("bpf map tests")
    mod = load("bpfmap", impl)
    fd = mod.map_create(bpfmap_py.BPF_MAP_TYPE_HASH, 8, 4, 16, "honk_hash")
    try:
        info = mod.map_info(fd)
        assert (info.type, info.key_size, info.value_size, info.max_entries, info.name) == (
            bpfmap_py.BPF_MAP_TYPE_HASH,
            8,
            4,
            16,
            "honk_hash",
        )
        key = b"12345678"
        mod.map_update(fd, key, b"abcd", bpfmap_py.BPF_NOEXIST)
        with pytest.raises(FileExistsError):
            mod.map_update(fd, key, b"wxyz", bpfmap_py.BPF_NOEXIST)
        assert mod.map_lookup(fd, key, 4) == b"abcd"
        mod.map_delete(fd, key)
        with pytest.raises(FileNotFoundError):
            mod.map_lookup(fd, key, 4)
    finally:
        os.close(fd)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_pinned_map_reopens_with_its_values(impl, tmp_path):
    require_bpf("bpf map tests")
    mod = load("bpfmap", impl)
    with private_bpffs(tmp_path) as pin_dir:
        pin_dir.mkdir()
        fd = mod.map_create(bpfmap_py.BPF_MAP_TYPE_ARRAY, 4, 8, 4, "honk_pin")
        mod.SlotMap(fd).set(2, 42)
        mod.obj_pin(fd, str(pin_dir / "m"))
        os.close(fd)
        again = mod.obj_get(pin_dir / "m")
        try:
            assert mod.SlotMap(again).get(2) == 42
        finally:
            os.close(again)
        with pytest.raises(FileNotFoundError):
            mod.obj_get(str(pin_dir / "absent"))
