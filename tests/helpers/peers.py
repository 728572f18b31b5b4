"""Real peer programs: required in CI, skippable on a developer's machine."""

from __future__ import annotations

import os
import shutil

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def require_binary(name: str) -> str:
    """Path of ``name``; with CI=true a missing peer fails the test instead of skipping it."""
    path = shutil.which(name)
    if path:
        return path
    if IN_CI:
        pytest.fail(f"{name} is required in CI; `make peers` installs it")
    pytest.skip(f"{name} is not installed (a missing peer skips only outside CI)")
