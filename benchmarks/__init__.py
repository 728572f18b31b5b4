"""honk's benchmarks: every figure is a ratio against a baseline measured in the same run."""

from __future__ import annotations

import cProfile
import json
import os
import pstats
import subprocess
import sys
from typing import Any


def twin_figures(module: str, quick: bool, timeout: float) -> Any:
    """``python -m <module> --json --no-twin [--quick]`` rerun with HONK_NO_EXTENSIONS=1: its
    figures, or None if it failed or did not run on the pure-Python twins."""
    argv = [sys.executable, "-m", module, "--json", "--no-twin"] + (["--quick"] if quick else [])
    env = dict(os.environ, HONK_NO_EXTENSIONS="1")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(
        argv, env=env, cwd=root, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        return None
    out = json.loads(done.stdout)
    return out["figures"] if out["implementation"] == "python" else None


def print_profile(profiler: cProfile.Profile, what: str, lines: int) -> None:
    """A finished profile of ``what``: its functions by own time, then by cumulative time."""
    stats = pstats.Stats(profiler)
    print(f"--- {what}, by own time")
    stats.sort_stats("tottime").print_stats(lines)
    print(f"--- {what}, by cumulative time")
    stats.sort_stats("cumulative").print_stats(lines)
