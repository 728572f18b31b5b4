"""The daemon helpers fail a test whose daemon logged an exception nobody retrieved: a process's
captured log when it stops (helpers.proc), an in-process daemon's log records (helpers.apidaemon)."""

from __future__ import annotations

import asyncio
import gc
import sys

import pytest
from helpers.apidaemon import UnretrievedWatch
from helpers.proc import LoggedProcess, unretrieved_lines

# a daemon-like program: a background task fails, nobody awaits it, and asyncio reports it on
# stderr when the task is collected (no handler configured: logging's last resort writes it)
DROPPED_TASK = """
import asyncio, gc, sys

async def fails():
    raise RuntimeError("lost in the background")

async def main():
    task = asyncio.ensure_future(fails())
    await asyncio.sleep(0)
    del task
    gc.collect()
    print("serving", file=sys.stderr, flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""
AWAITED_TASK = DROPPED_TASK.replace("del task", "assert isinstance(task.exception(), RuntimeError)")


def _started(code: str) -> LoggedProcess:
    process = LoggedProcess([sys.executable, "-c", code])
    process.wait_for("serving")
    return process


def test_a_process_that_logged_an_unretrieved_task_exception_fails_when_it_stops() -> None:
    process = _started(DROPPED_TASK)
    with pytest.raises(AssertionError, match="exception was never retrieved"):
        process.stop()
    assert unretrieved_lines(process.lines) == ["Task exception was never retrieved"]
    process.check_log()  # checked once: a second stop (a context manager's exit) does not fail again


def test_a_process_whose_tasks_were_all_retrieved_stops_cleanly() -> None:
    process = _started(AWAITED_TASK)
    assert process.stop() != 0  # SIGTERM, and nothing raised about its log


async def test_a_tests_own_dropped_task_is_left_out_and_one_from_outside_the_tests_is_caught() -> None:
    """A test may drop a task on purpose (to see the loop guard report it): what a test module's
    own coroutine raised is left out; a task whose coroutine lives outside tests/ (honk's, or
    here asyncio's wait_for around the same failure) is caught."""

    async def fails(text: str) -> None:
        raise RuntimeError(text)

    with UnretrievedWatch() as watch:
        own = asyncio.ensure_future(fails("the test's own"))
        outside = asyncio.ensure_future(asyncio.wait_for(fails("from outside the tests"), 1.0))
        await asyncio.wait([own, outside])
        del own, outside
        gc.collect()
    assert len(watch.found) == 1 and "from outside the tests" in watch.found[0]
