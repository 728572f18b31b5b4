"""Relay tests run on both event loops: stock asyncio and uvloop (the daemon's), and
``engine`` yields each relay engine present (helpers.engines.ENGINES)."""

from __future__ import annotations

import asyncio

import pytest
import uvloop
from helpers.engines import ENGINES, engine_class
from helpers.tls_rig import tls_contexts


def pytest_asyncio_loop_factories(config, item):
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


@pytest.fixture(params=ENGINES)
async def engine(request: pytest.FixtureRequest):
    eng = engine_class(request.param)(asyncio.get_running_loop())
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def contexts():
    """Client and server TLS contexts under a CA made for the module (the TLS framing tests)."""
    return tls_contexts()
