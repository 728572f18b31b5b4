"""Relay tests run on both event loops: stock asyncio and uvloop (the daemon's)."""

from __future__ import annotations

import asyncio

import uvloop


def pytest_asyncio_loop_factories(config, item):
    return {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}
