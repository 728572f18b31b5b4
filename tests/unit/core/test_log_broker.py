"""Live log readers: each gets the records at or above its level, from any thread, and a slow
reader loses the excess instead of holding anyone up."""

from __future__ import annotations

import asyncio
import io
import logging
import threading

import pytest

from honk.core import logs
from honk.core.logs import LOG_STREAM_QUEUE, LogBroker, daemon_level, set_level

log = logging.getLogger("honk.test.broker")


async def test_each_reader_gets_the_events_at_or_above_its_level():
    broker = LogBroker()
    broker.install()
    set_level("debug")
    try:
        info = broker.subscribe("info")
        debug = broker.subscribe("trace")
        silent = broker.subscribe("silent")
        log.debug("fine detail %s", "x=1")
        log.warning("careful")
        assert (await info.get()).message == "careful"
        first = await debug.get()
        assert (first.level, first.logger, first.message) == ("debug", "honk.test.broker", "fine detail x=1")
        assert (await debug.get()).level == "warning"
        assert silent.queue.empty()
        info.close()
        assert broker.readers == 2
    finally:
        broker.uninstall()
        set_level("info")


async def test_records_from_worker_threads_reach_the_reader_on_its_loop():
    broker = LogBroker()
    broker.install()
    try:
        sub = broker.subscribe("info")
        thread = threading.Thread(target=lambda: log.error("from a worker"))
        thread.start()
        thread.join()
        event = await asyncio.wait_for(sub.get(), 5)
        assert (event.level, event.message) == ("error", "from a worker")
    finally:
        broker.uninstall()


async def test_a_reader_that_falls_behind_loses_the_excess_and_counts_it():
    broker = LogBroker()
    broker.install()
    try:
        sub = broker.subscribe("info")
        for i in range(LOG_STREAM_QUEUE + 10):
            log.info("line %d", i)
        assert sub.queue.qsize() == LOG_STREAM_QUEUE
        assert sub.dropped == 10
        assert (await sub.get()).message == "line 0"
    finally:
        broker.uninstall()


# --- a reader's level against the daemon's ------------------------------------------------------


@pytest.fixture
def stderr(monkeypatch):
    """The daemon's stderr handler (on a buffer) at ``info``; the honk logger as it was after."""
    honk = logging.getLogger("honk")
    level = honk.level
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    monkeypatch.setattr(logs, "_HANDLER", handler)
    honk.addHandler(handler)
    set_level("info")
    try:
        yield buffer
    finally:
        honk.removeHandler(handler)
        set_level("info")
        honk.setLevel(level)


async def test_a_debug_reader_gets_debug_lines_while_stderr_keeps_the_daemons_level(stderr):
    honk = logging.getLogger("honk")
    broker = LogBroker()
    broker.install()
    try:
        assert not log.isEnabledFor(logging.DEBUG)
        sub = broker.subscribe("debug")
        assert honk.level == logging.DEBUG and daemon_level() == logging.INFO
        log.debug("fine detail")
        log.info("routine")
        assert [(await sub.get()).message, (await sub.get()).message] == ["fine detail", "routine"]
        assert "routine" in stderr.getvalue() and "fine detail" not in stderr.getvalue()
        sub.close()
        assert honk.level == logging.INFO and not log.isEnabledFor(logging.DEBUG)
    finally:
        broker.uninstall()


async def test_the_logger_goes_back_only_when_the_last_low_reader_leaves(stderr):
    honk = logging.getLogger("honk")
    broker = LogBroker()
    broker.install()
    try:
        trace, debug, info = broker.subscribe("trace"), broker.subscribe("debug"), broker.subscribe("info")
        assert honk.level == logs.TRACE
        trace.close()
        assert honk.level == logging.DEBUG
        info.close()
        assert honk.level == logging.DEBUG
        debug.close()
        debug.close()  # idempotent
        assert honk.level == logging.INFO
    finally:
        broker.uninstall()


async def test_a_level_change_while_a_debug_reader_is_open_moves_stderr_not_the_reader(stderr):
    honk = logging.getLogger("honk")
    broker = LogBroker()
    broker.install()
    try:
        sub = broker.subscribe("debug")
        set_level("warn")  # a reload or PATCH /configs log-level
        assert (honk.level, daemon_level()) == (logging.DEBUG, logging.WARNING)
        log.info("routine")
        assert (await sub.get()).message == "routine"
        assert "routine" not in stderr.getvalue()
        set_level("debug")
        log.debug("now wanted")
        assert "now wanted" in stderr.getvalue()
        set_level("warn")
        sub.close()
        assert honk.level == logging.WARNING
    finally:
        broker.uninstall()


async def test_an_info_reader_of_a_daemon_at_warn_gets_info_and_stderr_does_not(stderr):
    set_level("warn")
    broker = LogBroker()
    broker.install()
    try:
        assert not log.isEnabledFor(logging.INFO)  # a daemon at warn with no reader: nothing built
        sub = broker.subscribe("info")
        log.info("for the dashboard")
        assert (await sub.get()).message == "for the dashboard"
        assert stderr.getvalue() == ""
    finally:
        broker.uninstall()
    assert logging.getLogger("honk").level == logging.WARNING  # an uninstalled broker's readers count no more
