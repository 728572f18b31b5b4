"""The twins run without Cython: ``honk._fast._cython`` stands in for the ``cython`` module (issue 37).

tests/integration/test_install_without_cython.py checks the same on a real install in a fresh venv.
"""

import ast
import subprocess
import sys
from pathlib import Path

from honk._fast import _cython

FAST = Path(__file__).resolve().parents[3] / "honk" / "_fast"
TWINS_USING_CYTHON = sorted(p for p in FAST.glob("*_py.py") if "import cython" in p.read_text())


def _guarded(tree: ast.Module) -> bool:
    """Whether every ``import cython`` sits in a ``try`` whose handler imports the stand-in."""
    guarded = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            imports = [a.name for s in node.body if isinstance(s, ast.Import) for a in s.names]
            fallback = [
                (s.module, a.name, a.asname)
                for h in node.handlers
                for s in h.body
                if isinstance(s, ast.ImportFrom)
                for a in s.names
            ]
            if imports == ["cython"] and fallback == [("honk._fast", "_cython", "cython")]:
                guarded += 1
    every = sum(a.name == "cython" for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names)
    return every == guarded > 0


def test_the_twins_that_read_cython_import_it_with_the_fallback():
    assert [p.name for p in TWINS_USING_CYTHON] == [
        "cell_py.py",
        "nodeid_py.py",
        "rank_py.py",
        "valuetype_py.py",
    ]
    for path in TWINS_USING_CYTHON:
        assert _guarded(ast.parse(path.read_text())), f"{path.name}: a bare `import cython`"


def test_the_stand_in_has_every_name_a_twin_reads_of_cython():
    for path in TWINS_USING_CYTHON:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "cython"
            ):
                assert hasattr(_cython, node.attr), (
                    f"{path.name} reads cython.{node.attr}: add it to _cython.py"
                )
    assert _cython.compiled is False


def test_honk_imports_its_score_kernels_when_cython_cannot_be_imported():
    script = """
import sys
class NoCython:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("cython", "Cython"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoCython())
import honk.group.manager
from honk._fast import _cython, cell_py, nodeid_py, rank_py, valuetype_py
assert all(m.cython is _cython for m in (cell_py, nodeid_py, rank_py, valuetype_py))
node = nodeid_py.NodeId(int=7)
assert hash(node) == hash(7) and valuetype_py.install(int) is int
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
