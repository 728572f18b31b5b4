"""Hot-path kernels, each compiled with Cython when possible, with a pure-Python twin.

Layout per kernel ``<name>``:

* ``<name>_py.py``: the reference implementation, and also the Cython source;
* ``<name>_c.pxd``: C types for the compiled build of that same file;
* ``<name>.py``: the selector the rest of honk imports.

Cython is needed to build only: a twin that reads ``cython.compiled`` falls back to
``_cython.py`` when the ``cython`` module is not installed.

``HONK_NO_EXTENSIONS=1`` forces the twins; :data:`NO_EXTENSIONS` records it.
"""

import importlib
import os
import sys
from types import ModuleType

NO_EXTENSIONS = bool(os.environ.get("HONK_NO_EXTENSIONS")) or sys.implementation.name != "cpython"
# Every selector module honk/_fast/<name>.py; each exposes IMPLEMENTATION.
KERNELS = tuple(
    k
    for k in (
        "movavg",
        "ring",
        "decay",
        "beta",
        "cell",
        "rank",
        "nodeid",
        "valuetype",
        "relay",
        "socks5hs",
        "bpfmap",
        "tlsverify",
        "vmesskdf",
    )
    if os.path.exists(os.path.join(os.path.dirname(__file__), f"{k}.py"))
)


def load(kernel: str) -> tuple[ModuleType, str]:
    """The module that implements ``kernel``, and which one it is.

    The compiled ``<kernel>_c`` unless ``HONK_NO_EXTENSIONS`` is set or it was
    not built (a source checkout), else the pure-Python ``<kernel>_py``.
    """
    if not NO_EXTENSIONS:
        try:
            return importlib.import_module(f"honk._fast.{kernel}_c"), "compiled"
        except ImportError:
            pass
    return importlib.import_module(f"honk._fast.{kernel}_py"), "python"


def implementations() -> dict[str, str]:
    """Which implementation each kernel uses: ``"compiled"`` or ``"python"``."""
    out = {}
    for name in KERNELS:
        mod = importlib.import_module(f"honk._fast.{name}")
        out[name] = mod.IMPLEMENTATION
    return out
