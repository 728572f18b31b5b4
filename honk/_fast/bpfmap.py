"""Selects the raw bpf(2) map module; the rest of honk imports this.

``bpfmap_c`` makes the syscall in C (the slot writes of the hot path); ``bpfmap_py`` is the
ctypes twin with the same API and errors. ``HONK_NO_EXTENSIONS=1`` forces the twin. Both
share the constants and :class:`MapInfo` of :mod:`honk._fast.bpfmap_py`.
"""

from typing import TYPE_CHECKING

from honk._fast import load
from honk._fast.bpfmap_py import (
    BPF_ANY,
    BPF_EXIST,
    BPF_MAP_TYPE_ARRAY,
    BPF_MAP_TYPE_HASH,
    BPF_MAP_TYPE_PERCPU_ARRAY,
    BPF_NOEXIST,
    MapInfo,
)

IMPLEMENTATION: str
if TYPE_CHECKING:
    from honk._fast.bpfmap_py import (
        SlotMap,
        map_create,
        map_delete,
        map_info,
        map_lookup,
        map_update,
        obj_get,
        obj_pin,
    )
else:
    _impl, IMPLEMENTATION = load("bpfmap")
    SlotMap = _impl.SlotMap
    map_create = _impl.map_create
    map_delete = _impl.map_delete
    map_info = _impl.map_info
    map_lookup = _impl.map_lookup
    map_update = _impl.map_update
    obj_get = _impl.obj_get
    obj_pin = _impl.obj_pin

__all__ = [
    "BPF_ANY",
    "BPF_EXIST",
    "BPF_MAP_TYPE_ARRAY",
    "BPF_MAP_TYPE_HASH",
    "BPF_MAP_TYPE_PERCPU_ARRAY",
    "BPF_NOEXIST",
    "IMPLEMENTATION",
    "MapInfo",
    "SlotMap",
    "map_create",
    "map_delete",
    "map_info",
    "map_lookup",
    "map_update",
    "obj_get",
    "obj_pin",
]
