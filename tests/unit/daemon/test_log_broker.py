"""Live log readers: each gets the records at or above its level, from any thread, and a slow
reader loses the excess instead of holding anyone up."""

from __future__ import annotations

import asyncio
import logging
import threading

from honk.daemon.logs import LOG_STREAM_QUEUE, LogBroker, set_level

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
