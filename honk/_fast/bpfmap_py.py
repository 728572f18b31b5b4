"""Raw ``bpf(2)`` map access through ctypes: the twin of ``bpfmap_c`` (same API, same errors).

Only what honk's datapath needs: create a map, pin it and open a pin, read a map's info,
and update/look up/delete one element. Every failure is ``OSError`` with the kernel's
errno and the command's name in the message; nothing is retried. File descriptors are
plain ints that the caller owns and closes.

:class:`SlotMap` is the hot path: one ``BPF_MAP_UPDATE_ELEM`` of a ``u32 -> u64`` array
per slot write, with the key, value and attribute buffers allocated once.
"""

from __future__ import annotations

import ctypes
import errno as _errno
import os
import platform
import struct
from typing import NamedTuple

# bpf(2) commands (include/uapi/linux/bpf.h)
BPF_MAP_CREATE = 0
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_OBJ_PIN = 6
BPF_OBJ_GET = 7
BPF_OBJ_GET_INFO_BY_FD = 15

# map types honk uses
BPF_MAP_TYPE_HASH = 1
BPF_MAP_TYPE_ARRAY = 2
BPF_MAP_TYPE_PERCPU_ARRAY = 6

# update flags
BPF_ANY = 0
BPF_NOEXIST = 1
BPF_EXIST = 2

BPF_OBJ_NAME_LEN = 16  # map names: at most 15 bytes and a NUL
ATTR_SIZE = 128  # bytes of union bpf_attr passed; the kernel wants the unused tail zeroed
MAP_INFO_SIZE = 40  # the head of struct bpf_map_info honk reads (type ... name)

# SYS_bpf per machine (the compiled module takes it from <sys/syscall.h>)
_SYS_BPF = {
    "x86_64": 321,
    "aarch64": 280,
    "arm64": 280,
    "riscv64": 280,
    "armv7l": 386,
    "armv6l": 386,
    "i686": 357,
    "i386": 357,
    "ppc64le": 361,
    "ppc64": 361,
    "s390x": 351,
    "loongarch64": 280,
}
SYS_BPF = _SYS_BPF.get(platform.machine(), -1)

_COMMAND_NAMES = {
    BPF_MAP_CREATE: "BPF_MAP_CREATE",
    BPF_MAP_LOOKUP_ELEM: "BPF_MAP_LOOKUP_ELEM",
    BPF_MAP_UPDATE_ELEM: "BPF_MAP_UPDATE_ELEM",
    BPF_MAP_DELETE_ELEM: "BPF_MAP_DELETE_ELEM",
    BPF_OBJ_PIN: "BPF_OBJ_PIN",
    BPF_OBJ_GET: "BPF_OBJ_GET",
    BPF_OBJ_GET_INFO_BY_FD: "BPF_OBJ_GET_INFO_BY_FD",
}

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long


class MapInfo(NamedTuple):
    """What the kernel says about a map (the head of ``struct bpf_map_info``)."""

    type: int
    id: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    name: str


def bpf_error(err: int, cmd: int) -> OSError:
    """The error both implementations raise for a failed command."""
    return OSError(err, f"{os.strerror(err)} ({_COMMAND_NAMES.get(cmd, f'bpf command {cmd}')})")


def _call(cmd: int, attr: ctypes.Array) -> int:
    if SYS_BPF < 0:
        raise bpf_error(_errno.ENOSYS, cmd)
    result = _syscall(ctypes.c_long(SYS_BPF), ctypes.c_long(cmd), attr, ctypes.c_long(ATTR_SIZE))
    if result < 0:
        raise bpf_error(ctypes.get_errno(), cmd)
    return result


def _attr(packed: bytes) -> ctypes.Array:
    return ctypes.create_string_buffer(packed, ATTR_SIZE)


def _path(path: str | bytes) -> ctypes.Array:
    return ctypes.create_string_buffer(os.fsencode(path))


def map_create(
    map_type: int, key_size: int, value_size: int, max_entries: int, name: str | bytes = b"", flags: int = 0
) -> int:
    """A new map's fd (``BPF_MAP_CREATE``); ``name`` is cut to 15 bytes."""
    raw = os.fsencode(name)[: BPF_OBJ_NAME_LEN - 1]
    return _call(
        BPF_MAP_CREATE,
        _attr(struct.pack("=7I16s", map_type, key_size, value_size, max_entries, flags, 0, 0, raw)),
    )


def obj_pin(fd: int, path: str | bytes) -> None:
    """Pin the map or program ``fd`` at ``path`` on a bpffs."""
    p = _path(path)
    _call(BPF_OBJ_PIN, _attr(struct.pack("=QiI", ctypes.addressof(p), fd, 0)))


def obj_get(path: str | bytes, flags: int = 0) -> int:
    """A new fd for the object pinned at ``path``."""
    p = _path(path)
    return _call(BPF_OBJ_GET, _attr(struct.pack("=QII", ctypes.addressof(p), 0, flags)))


def map_info(fd: int) -> MapInfo:
    info = ctypes.create_string_buffer(MAP_INFO_SIZE)
    _call(BPF_OBJ_GET_INFO_BY_FD, _attr(struct.pack("=iIQ", fd, MAP_INFO_SIZE, ctypes.addressof(info))))
    kind, ident, key_size, value_size, max_entries, flags, name = struct.unpack("=6I16s", info.raw)
    return MapInfo(
        kind,
        ident,
        key_size,
        value_size,
        max_entries,
        flags,
        name.split(b"\0", 1)[0].decode("ascii", "replace"),
    )


def _elem(cmd: int, fd: int, key: ctypes.Array, value: ctypes.Array | None, flags: int) -> None:
    value_address = ctypes.addressof(value) if value is not None else 0
    _call(cmd, _attr(struct.pack("=iIQQQ", fd, 0, ctypes.addressof(key), value_address, flags)))


def map_update(fd: int, key: bytes, value: bytes, flags: int = BPF_ANY) -> None:
    """Write one element; ``key`` and ``value`` are the map's raw key and value bytes."""
    _elem(
        BPF_MAP_UPDATE_ELEM,
        fd,
        ctypes.create_string_buffer(key, len(key)),
        ctypes.create_string_buffer(value, len(value)),
        flags,
    )


def map_lookup(fd: int, key: bytes, value_size: int) -> bytes:
    """One element's raw value (``value_size`` bytes; a per-CPU map needs size x possible CPUs).
    A missing key raises ``OSError(ENOENT)``."""
    out = ctypes.create_string_buffer(value_size)
    _elem(BPF_MAP_LOOKUP_ELEM, fd, ctypes.create_string_buffer(key, len(key)), out, 0)
    return out.raw


def map_delete(fd: int, key: bytes) -> None:
    """Delete one element (hash maps; arrays answer ``EINVAL``)."""
    _elem(BPF_MAP_DELETE_ELEM, fd, ctypes.create_string_buffer(key, len(key)), None, 0)


U32_MAX = 0xFFFFFFFF
U64_MAX = 0xFFFFFFFFFFFFFFFF


class SlotMap:
    """One ``u32 -> u64`` map by fd (the fd stays the caller's to close)."""

    __slots__ = ("fd", "_key", "_value", "_update", "_lookup")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._key = ctypes.c_uint32()
        self._value = ctypes.c_uint64()
        self._update = _attr(
            struct.pack("=iIQQQ", fd, 0, ctypes.addressof(self._key), ctypes.addressof(self._value), BPF_ANY)
        )
        self._lookup = _attr(
            struct.pack("=iIQQQ", fd, 0, ctypes.addressof(self._key), ctypes.addressof(self._value), 0)
        )

    def set(self, slot: int, value: int) -> None:
        if not 0 <= slot <= U32_MAX or not 0 <= value <= U64_MAX:
            raise OverflowError("slot must fit u32 and value u64")
        self._key.value = slot
        self._value.value = value
        _call(BPF_MAP_UPDATE_ELEM, self._update)

    def get(self, slot: int) -> int:
        if not 0 <= slot <= U32_MAX:
            raise OverflowError("slot must fit u32")
        self._key.value = slot
        _call(BPF_MAP_LOOKUP_ELEM, self._lookup)
        return self._value.value
