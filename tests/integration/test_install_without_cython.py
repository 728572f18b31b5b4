"""An installed honk imports every one of its modules without Cython (issue 37).

Cython is a build dependency only: the kernels' pure-Python twins are also the compiled modules'
Cython sources, and must not need the ``cython`` module when they run. The test builds a wheel
of this tree without extensions (the build uses this venv's setuptools, no index), installs it
with its declared dependencies into a fresh venv (no system site packages, no pip of its own:
this venv's pip installs into it, from the configured index or pip's cache), checks that venv
has no ``cython`` module, and imports there, by name, every module the source tree holds.

About 10 s with the dependencies cached. An index that cannot be reached skips the test, and fails
it with CI=true.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.peers import require

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[2]
# what the wheel is built from: the package and what pyproject.toml names
SOURCES = ("honk", "setup.py", "pyproject.toml", "README.md", "LICENSE")
STEP = 180  # seconds for one build or install step (the install may download)

# Run by the fresh venv's interpreter in isolated mode (-I: no PYTHON* variables, no user site,
# not the working directory): import each module named in argv, report as JSON.
IMPORT_ALL = """
import importlib, importlib.util, json, sys, traceback
failed = {}
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except BaseException:
        failed[name] = traceback.format_exc(limit=-3)
import honk
print(json.dumps({"honk": honk.__file__, "failed": failed,
                  "cython": [m for m in ("cython", "Cython") if importlib.util.find_spec(m) is not None]}))
"""


def _clean_env(**extra: str) -> dict[str, str]:
    """This environment without what would let the fresh venv see this tree or this venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(extra)
    return env


def _copy_sources(into: Path) -> None:
    """The tree's package sources (tracked and new files, nothing ignored: no built .so or .c)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *SOURCES],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        source = REPO / rel
        if source.is_file():  # a tracked file deleted in the working tree is not listed twice
            (into / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / rel)


def _module_names(tree: Path) -> list[str]:
    """Every module of the ``honk`` package in ``tree`` (packages by their ``__init__``)."""
    names = []
    for path in sorted((tree / "honk").rglob("*.py")):
        parts = path.relative_to(tree).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_an_installed_honk_imports_every_module_without_cython(tmp_path: Path) -> None:
    require(
        shutil.which("git") is not None and (REPO / ".git").exists(),
        "listing the package's sources needs git and this repository's checkout",
    )
    source = tmp_path / "src"
    _copy_sources(source)
    modules = _module_names(source)
    assert "honk.group.manager" in modules and "honk._fast.cell_py" in modules

    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(source),
        ],
        env=_clean_env(HONK_NO_EXTENSIONS="1"),
        capture_output=True,
        text=True,
        timeout=STEP,
    )
    assert built.returncode == 0, (
        f"building the wheel failed:\n{built.stdout[-3000:]}\n{built.stderr[-3000:]}"
    )
    (wheel,) = wheels.glob("honk-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name  # the twins only: no compiled module

    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)], env=_clean_env(), check=True, timeout=STEP
    )
    python = venv / "bin" / "python"
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-input", str(wheel)],
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=STEP,
    )
    require(
        installed.returncode == 0,
        "installing honk's dependencies into a fresh venv failed "
        f"(no package index or cache?):\n{installed.stderr[-2000:]}",
    )

    ran = subprocess.run(
        [str(python), "-I", "-c", IMPORT_ALL, *modules],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=STEP,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    report = json.loads(ran.stdout.splitlines()[-1])
    assert report["cython"] == [], "the fresh venv has Cython: it became a runtime dependency"
    assert Path(report["honk"]).is_relative_to(venv), f"honk came from {report['honk']}, not the fresh venv"
    assert report["failed"] == {}, "modules that do not import without Cython:\n" + "\n".join(
        f"{name}:\n{trace}" for name, trace in report["failed"].items()
    )
