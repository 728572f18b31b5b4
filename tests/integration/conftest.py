"""Fixtures for loopback integration tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Callable[[Coroutine[Any, Any, Any]], Any]:
    """Run a coroutine to completion on a fresh loop: once on stock asyncio, once on uvloop."""
    return asyncio.run if request.param == "asyncio" else uvloop.run
