"""Loading honk's BPF object with libbpf1 through ctypes, and attaching it to tc ingress.

* :func:`ensure_bpffs` makes sure the pin directory lives on a bpffs, mounting one at
  ``/sys/fs/bpf`` when the pin directory is below it and nothing is mounted there (machines
  without systemd do not mount it).
* :class:`BpfObject` opens a clang-built object, gives every map a pin path
  ``<pin dir>/<map name>``, and loads it. A pinned map whose type, key, value or size still
  match the object is reused (libbpf binds the program to it), so a restart keeps every slot
  and rule; a pin that no longer matches (a layout change between versions) is removed first
  and the map is created anew. :attr:`BpfObject.created` names the maps that were new.
* :func:`attach_tc_ingress` / :func:`detach_tc_ingress` put the classifier on an
  interface's clsact ingress hook as a direct-action filter with honk's fixed handle and
  priority; an existing clsact qdisc is fine, and attaching replaces a filter an earlier run
  left there. Netlink attachments outlive the process.

libbpf's own messages go to the ``honk.ebpf`` logger at debug level; the last ones are kept
and appended to the error of a failed load (the verifier's log, for example).

Everything here acts on the calling thread's network namespace.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import logging
import os
import re
import socket
from pathlib import Path

from honk._fast import bpfmap

log = logging.getLogger("honk.ebpf")

LIBBPF = "libbpf.so.1"
BPFFS_ROOT = "/sys/fs/bpf"
DEFAULT_PIN_DIR = "/sys/fs/bpf/honk"
BPF_TC_INGRESS = 1  # enum bpf_tc_attach_point
BPF_TC_F_REPLACE = 1  # enum bpf_tc_flags
TC_HANDLE = 0x484B  # honk's filter handle ("HK") on the clsact ingress hook
TC_PRIORITY = 1  # honk's filter runs first
LIBBPF_MESSAGES_KEPT = 40  # lines of libbpf output attached to a failed load's error
LIBBPF_MESSAGE_SIZE = 4096  # bytes one formatted libbpf message may take
PIN_DIR_MODE = 0o700
_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")  # how mountinfo writes space, tab, newline, backslash


class LoaderError(OSError):
    """libbpf or the kernel refused a step; ``errno`` is the kernel's answer."""


# --- libbpf through ctypes --------------------------------------------------------------


class _TcHook(ctypes.Structure):  # struct bpf_tc_hook (libbpf 1.x)
    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("ifindex", ctypes.c_int),
        ("attach_point", ctypes.c_int),
        ("parent", ctypes.c_uint32),
    ]


class _TcOpts(ctypes.Structure):  # struct bpf_tc_opts (libbpf 1.x)
    _fields_ = [
        ("sz", ctypes.c_size_t),
        ("prog_fd", ctypes.c_int),
        ("flags", ctypes.c_uint32),
        ("prog_id", ctypes.c_uint32),
        ("handle", ctypes.c_uint32),
        ("priority", ctypes.c_uint32),
    ]


_P, _I, _U32, _S = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_char_p
_SIGNATURES = {
    "bpf_object__open_file": (_P, [_S, _P]),
    "bpf_object__load": (_I, [_P]),
    "bpf_object__close": (None, [_P]),
    "bpf_object__next_map": (_P, [_P, _P]),
    "bpf_object__find_map_by_name": (_P, [_P, _S]),
    "bpf_object__find_program_by_name": (_P, [_P, _S]),
    "bpf_map__name": (_S, [_P]),
    "bpf_map__set_pin_path": (_I, [_P, _S]),
    "bpf_map__fd": (_I, [_P]),
    "bpf_map__type": (_I, [_P]),
    "bpf_map__key_size": (_U32, [_P]),
    "bpf_map__value_size": (_U32, [_P]),
    "bpf_map__max_entries": (_U32, [_P]),
    "bpf_map__map_flags": (_U32, [_P]),
    "bpf_program__fd": (_I, [_P]),
    "bpf_tc_hook_create": (_I, [_P]),
    "bpf_tc_attach": (_I, [_P, _P]),
    "bpf_tc_detach": (_I, [_P, _P]),
    "libbpf_set_print": (_P, [_P]),
}

_PrintFn = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
_messages: collections.deque[str] = collections.deque(maxlen=LIBBPF_MESSAGES_KEPT)
_lib: ctypes.CDLL | None = None
_printer = None  # keeps the callback alive as long as libbpf may call it


def _print(level: int, fmt: bytes, args: int) -> int:
    """libbpf's print callback: format with vsnprintf (the va_list travels as a pointer)."""
    buf = ctypes.create_string_buffer(LIBBPF_MESSAGE_SIZE)
    _vsnprintf(buf, LIBBPF_MESSAGE_SIZE, fmt, args)
    text = buf.value.decode("utf-8", "replace").rstrip()
    if text:
        _messages.append(text)
        log.debug("%s", text)
    return 0


_libc = ctypes.CDLL(None, use_errno=True)
_vsnprintf = _libc.vsnprintf
_vsnprintf.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p]
_vsnprintf.restype = ctypes.c_int
_mount = _libc.mount
_mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_void_p]
_mount.restype = ctypes.c_int


def libbpf() -> ctypes.CDLL:
    """libbpf1, typed; raises ``OSError`` when it is not installed."""
    global _lib, _printer
    if _lib is None:
        lib = ctypes.CDLL(LIBBPF, use_errno=True)
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
        _printer = _PrintFn(_print)
        lib.libbpf_set_print(ctypes.cast(_printer, ctypes.c_void_p))
        _lib = lib
    return _lib


def _check(rc: int, what: str) -> int:
    """libbpf 1.x returns -errno."""
    if rc < 0:
        raise LoaderError(-rc, f"{what}: {os.strerror(-rc)}")
    return rc


def _recent_messages() -> str:
    lines = list(_messages)
    return ("\n" + "\n".join(lines)) if lines else ""


# --- bpffs -------------------------------------------------------------------------------


def _mount_points() -> dict[str, str]:
    """Mount point -> file-system type, from this process's mountinfo."""
    out: dict[str, str] = {}
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = left.split()
            if len(fields) >= 5 and right:
                point = _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), fields[4])  # \040: a space
                out[point] = right.split()[0]
    return out


def filesystem_of(path: str) -> str:
    """The type of the file system that holds ``path`` (the longest mount point above it)."""
    mounts = _mount_points()
    probe = os.path.abspath(path)
    while True:
        if probe in mounts:
            return mounts[probe]
        if probe == "/":
            return ""
        probe = os.path.dirname(probe)


def ensure_bpffs(pin_dir: str) -> bool:
    """Make ``pin_dir`` exist on a bpffs; mount one at ``/sys/fs/bpf`` when needed and allowed.
    Whether it mounted one.

    Raises ``OSError`` when the directory is not on a bpffs and none can be mounted."""
    mounted = False
    if filesystem_of(pin_dir) != "bpf":
        root = BPFFS_ROOT
        if os.path.commonpath([os.path.abspath(pin_dir), root]) != root or filesystem_of(root) == "bpf":
            raise OSError(errno.ENOTSUP, f"{pin_dir} is not on a bpffs")
        if not os.path.isdir(root):
            raise OSError(errno.ENOENT, f"{root} does not exist (no bpffs mount point)")
        if _mount(b"bpf", root.encode(), b"bpf", 0, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount -t bpf bpf {root}: {os.strerror(err)}")
        mounted = True
    os.makedirs(pin_dir, mode=PIN_DIR_MODE, exist_ok=True)
    return mounted


# --- the object -----------------------------------------------------------------------------


class BpfObject:
    """One opened and loaded BPF object file, with its maps pinned under ``pin_dir``."""

    def __init__(self, path: str | os.PathLike[str], pin_dir: str) -> None:
        self.lib = libbpf()
        self.path = os.fspath(path)
        self.pin_dir = pin_dir
        self.created: list[str] = []  # maps created by this load (not reused from a pin)
        _messages.clear()
        obj = self.lib.bpf_object__open_file(os.fsencode(self.path), None)
        if not obj:
            err = ctypes.get_errno() or errno.EINVAL
            raise LoaderError(err, f"open {self.path}: {os.strerror(err)}{_recent_messages()}")
        self._obj: int | None = obj

    @classmethod
    def load(cls, path: str | os.PathLike[str], pin_dir: str) -> BpfObject:
        """Open ``path``, pin every map under ``pin_dir`` (reusing compatible pins), load."""
        self = cls(path, pin_dir)
        try:
            self._pin_and_load()
        except BaseException:
            self.close()
            raise
        return self

    def _maps(self) -> list[tuple[str, int]]:
        out = []
        handle = self.lib.bpf_object__next_map(self._obj, None)
        while handle:
            out.append((self.lib.bpf_map__name(handle).decode(), handle))
            handle = self.lib.bpf_object__next_map(self._obj, handle)
        return out

    def _pin_and_load(self) -> None:
        for name, handle in self._maps():
            if name.startswith("."):
                continue  # .rodata/.bss: internal, never pinned
            pin = os.path.join(self.pin_dir, name)
            if not self._pin_compatible(pin, handle):
                self.created.append(name)
            _check(self.lib.bpf_map__set_pin_path(handle, pin.encode()), f"pin path {pin}")
        rc = self.lib.bpf_object__load(self._obj)
        if rc < 0:
            raise LoaderError(-rc, f"load {self.path}: {os.strerror(-rc)}{_recent_messages()}")

    def _pin_compatible(self, pin: str, handle: int) -> bool:
        """Whether the map pinned at ``pin`` will be reused; an incompatible pin is removed."""
        if not os.path.exists(pin):
            return False
        try:
            fd = bpfmap.obj_get(pin)
        except OSError as exc:
            log.warning("ebpf: pinned %s cannot be opened (%s); it is replaced", pin, exc.strerror)
            os.unlink(pin)
            return False
        try:
            info = bpfmap.map_info(fd)
        finally:
            os.close(fd)
        lib = self.lib
        wanted = (
            lib.bpf_map__type(handle),
            lib.bpf_map__key_size(handle),
            lib.bpf_map__value_size(handle),
            lib.bpf_map__max_entries(handle),
            lib.bpf_map__map_flags(handle),
        )
        if (info.type, info.key_size, info.value_size, info.max_entries, info.flags) == wanted:
            return True
        log.warning("ebpf: pinned %s has another layout (%s); it is replaced", pin, info)
        os.unlink(pin)
        return False

    def map_fd(self, name: str) -> int:
        """The fd of map ``name`` (owned by the object: valid until :meth:`close`)."""
        handle = self.lib.bpf_object__find_map_by_name(self._obj, name.encode())
        if not handle:
            raise LoaderError(errno.ENOENT, f"{self.path} has no map {name}")
        return _check(self.lib.bpf_map__fd(handle), f"map {name}")

    def program_fd(self, name: str) -> int:
        handle = self.lib.bpf_object__find_program_by_name(self._obj, name.encode())
        if not handle:
            raise LoaderError(errno.ENOENT, f"{self.path} has no program {name}")
        return _check(self.lib.bpf_program__fd(handle), f"program {name}")

    def close(self) -> None:
        """Close the object's fds; pinned maps and tc attachments stay."""
        if self._obj is not None:
            self.lib.bpf_object__close(self._obj)
            self._obj = None


# --- tc ----------------------------------------------------------------------------------------


def _ifindex(interface: str | int) -> int:
    if isinstance(interface, int):
        return interface
    try:
        return socket.if_nametoindex(interface)
    except OSError as exc:
        raise LoaderError(errno.ENODEV, f"no interface {interface}") from exc


def attach_tc_ingress(
    interface: str | int, prog_fd: int, *, handle: int = TC_HANDLE, priority: int = TC_PRIORITY
) -> None:
    """Attach ``prog_fd`` as a direct-action filter on ``interface``'s ingress, replacing
    honk's filter from an earlier run; a clsact qdisc already there is kept."""
    lib = libbpf()
    hook = _TcHook(ctypes.sizeof(_TcHook), _ifindex(interface), BPF_TC_INGRESS, 0)
    rc = lib.bpf_tc_hook_create(ctypes.byref(hook))
    if rc not in (0, -errno.EEXIST):
        _check(rc, f"clsact on {interface}")
    opts = _TcOpts(ctypes.sizeof(_TcOpts), prog_fd, BPF_TC_F_REPLACE, 0, handle, priority)
    _check(lib.bpf_tc_attach(ctypes.byref(hook), ctypes.byref(opts)), f"tc ingress attach on {interface}")


def detach_tc_ingress(interface: str | int, *, handle: int = TC_HANDLE, priority: int = TC_PRIORITY) -> bool:
    """Remove honk's filter from ``interface``'s ingress (the qdisc stays); False when there
    was none (or the interface is gone)."""
    lib = libbpf()
    try:
        ifindex = _ifindex(interface)
    except LoaderError:
        return False
    hook = _TcHook(ctypes.sizeof(_TcHook), ifindex, BPF_TC_INGRESS, 0)
    opts = _TcOpts(ctypes.sizeof(_TcOpts), 0, 0, 0, handle, priority)
    rc = lib.bpf_tc_detach(ctypes.byref(hook), ctypes.byref(opts))
    if rc in (-errno.ENOENT, -errno.EINVAL, -errno.ENODEV):
        return False
    _check(rc, f"tc ingress detach on {interface}")
    return True


def default_object_path() -> Path | None:
    """The compiled classifier: next to this module (a build tree), else where a package puts it."""
    for candidate in (Path(__file__).with_name("datapath.bpf.o"), Path("/usr/lib/honk/datapath.bpf.o")):
        if candidate.is_file():
            return candidate
    return None
