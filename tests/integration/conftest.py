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
    return asyncio.run if request.param == "asyncio" else run_on_uvloop


def run_on_uvloop(main: Coroutine[Any, Any, Any]) -> Any:
    """``uvloop.run`` as the daemon runs it (uvloop 0.17, Debian 12's, has no ``uvloop.run``)."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)
