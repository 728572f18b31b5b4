"""Build honk, compiling the ``honk/_fast`` kernels with Cython when possible.

Each kernel ``honk/_fast/<name>_py.py`` is plain Python and is also the Cython
source of ``honk._fast.<name>_c``, typed by ``<name>_c.pxd``.

* ``HONK_NO_EXTENSIONS=1``: build nothing; the pure-Python twins are used.
* ``HONK_REQUIRE_EXTENSIONS=1``: a missing Cython or a failed compile is an error.
* otherwise: compile when Cython and a C compiler work, else fall back quietly
  (the build prints which it did).
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# Kernels compiled from their pure-Python twin (<name>_py.py typed by <name>_c.pxd),
# and modules written in Cython proper (<name>_c.pyx). A source that does not
# exist yet is skipped, so the list can name modules before they land.
KERNELS = ("movavg", "ring", "decay", "beta", "cell", "rank", "nodeid", "valuetype")
PYX_MODULES = ("relay", "socks5hs", "bpfmap", "tlsverify", "vmesskdf")
# C libraries a Cython module links with: the relay engine seals and opens Shadowsocks
# AEAD chunks with OpenSSL's libcrypto, and drives TLS flows' records with libssl (the
# library Python's _ssl uses; headers from libssl-dev); the chain cache hooks the same libssl;
# VMess's key derivation hashes with libcrypto's SHA-256.
LIBRARIES = {"relay": ["ssl", "crypto"], "tlsverify": ["ssl", "crypto"], "vmesskdf": ["crypto"]}
NO_EXTENSIONS = bool(os.environ.get("HONK_NO_EXTENSIONS"))
REQUIRE_EXTENSIONS = bool(os.environ.get("HONK_REQUIRE_EXTENSIONS"))


class OptionalBuildExt(build_ext):
    """Turn a compile failure into a fallback unless extensions are required."""

    def run(self):
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any build failure means "no extensions"
            if REQUIRE_EXTENSIONS:
                raise
            print(f"honk: building the _fast extensions failed ({exc}); using the pure-Python twins")

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            if REQUIRE_EXTENSIONS:
                raise
            print(f"honk: {ext.name} not built ({exc}); its pure-Python twin will be used")


def _drop_stale_sources(exts):
    """Remove a generated C file older than any kernel .pxd or C header: cythonize does not notice
    a changed augmenting .pxd (its own, or one it cimports) or header, and a stale module then
    fails at import with a binary-size mismatch. Regenerating the few small kernels is cheap."""
    pxds = [os.path.join("honk/_fast", f) for f in os.listdir("honk/_fast") if f.endswith((".pxd", ".pxi", ".h"))]
    newest = max((os.path.getmtime(p) for p in pxds), default=0.0)
    for ext in exts:
        generated = os.path.splitext(ext.sources[0])[0] + ".c"
        if os.path.exists(generated) and os.path.getmtime(generated) < newest:
            os.remove(generated)


def extensions():
    if NO_EXTENSIONS:
        print("honk: HONK_NO_EXTENSIONS set; not compiling the _fast kernels")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        if REQUIRE_EXTENSIONS:
            raise
        print("honk: Cython not available; using the pure-Python twins")
        return []
    exts = [Extension(f"honk._fast.{k}_c", [f"honk/_fast/{k}_py.py"]) for k in KERNELS
            if os.path.exists(f"honk/_fast/{k}_py.py")]
    exts += [Extension(f"honk._fast.{m}_c", [f"honk/_fast/{m}_c.pyx"], libraries=LIBRARIES.get(m, []))
             for m in PYX_MODULES if os.path.exists(f"honk/_fast/{m}_c.pyx")]
    print(f"honk: compiling {', '.join(e.name for e in exts)} with Cython")
    _drop_stale_sources(exts)
    return cythonize(exts, compiler_directives={"language_level": "3"}, quiet=True)


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})

if __name__ == "__main__" and "--help" in sys.argv:
    print(__doc__)
