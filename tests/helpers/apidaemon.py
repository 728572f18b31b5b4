"""A running daemon with its API on loopback, the .dae blocks that every control-surface test
repeats around its own nodes, groups and routing, and the parsed text of a /metrics answer.

The blocks are plain text with single braces: compose them with a test's own text after that
text's ``.format`` (a block put inside a ``.format`` template would need its braces doubled).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from helpers.proc import UNRETRIEVED
from honk.core.clock import Clock
from honk.daemon.app import Daemon

TESTS_DIR = Path(__file__).resolve().parent.parent  # where a test's own coroutines are defined

# the mixed inbound on a free loopback port (the tests read it back from daemon.inbounds["lan"])
WARM_SETTLE = 10.0  # seconds the first warm-up passes may take (a dial each, bounded by connect_timeout)
LAN_INBOUND = """inbound {
    lan: 'mixed://127.0.0.1:0'
}
"""


def quiet_global(data_dir: str | os.PathLike = "./var") -> str:
    """The global block these tests share: no check URL to reach, the periodic health check an
    hour away and no startup preconnect, so no probe or warm-up connection runs on its own
    during a test (a Selector's pin is waited for: ``running_daemon``)."""
    return f"""global {{
    data_dir: {data_dir}
    tcp_check_url: ''
    check_interval: 3600s
    preconnect_node_count: 0
}}
"""


def api_block(secret: str, extra: str = "") -> str:
    """The experimental block that binds the API on a free loopback port behind ``secret``;
    ``extra`` holds further clash_api lines, each indented by eight spaces and ending in a newline."""
    return f"""experimental {{
    clash_api {{
        external_controller: '127.0.0.1:0'
        secret: '{secret}'
{extra}    }}
}}
"""


class UnretrievedWatch(logging.Handler):
    """The log records of an in-process daemon that report an exception nobody retrieved: honk's
    loop guard logs them on ``honk`` while it is installed, asyncio's own handler on ``asyncio``
    before and after. A task of the test's own (its coroutine defined under tests/, such as one
    a test drops on purpose to see the loop guard report it) is the test's business, not the
    daemon's, and is left out."""

    LOGGERS = ("honk", "asyncio")

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.found: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if UNRETRIEVED.search(message) and not _raised_in_test_code(record):
            self.found.append(f"{record.name}: {message}\n{self.format(record)}")

    def __enter__(self) -> UnretrievedWatch:
        for name in self.LOGGERS:
            logging.getLogger(name).addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        for name in self.LOGGERS:
            logging.getLogger(name).removeHandler(self)


def _raised_in_test_code(record: logging.LogRecord) -> bool:
    """Whether the unretrieved exception came out of a coroutine a test module defined: the
    traceback's outermost frame is the failed task's coroutine."""
    if not record.exc_info or record.exc_info[2] is None:
        return False
    outermost = Path(record.exc_info[2].tb_frame.f_code.co_filename).resolve()
    return outermost.is_relative_to(TESTS_DIR)


@contextlib.asynccontextmanager
async def running_daemon(
    tmp_path: Path, config_text: str, clock: Clock | None = None
) -> AsyncIterator[Daemon]:
    """A daemon started from ``config_text`` written to ``tmp_path/honk.dae``, shut down on exit.
    Fails the test if the daemon's log reported an exception nobody retrieved."""
    config = tmp_path / "honk.dae"
    config.write_text(config_text)
    with UnretrievedWatch() as watch:
        daemon = Daemon(config, clock=clock)
        await daemon.start()
        await asyncio.wait_for(daemon.warm.rested(), WARM_SETTLE)  # its first warm-up passes done
        try:
            yield daemon
        finally:
            await daemon.shutdown(0.0)
            gc.collect()  # a dropped task's exception is reported when the task is collected
    assert not watch.found, "the daemon logged exceptions nobody retrieved:\n" + "\n".join(watch.found)


def api_port(daemon: Daemon) -> int:
    assert daemon.api is not None and daemon.api.bound is not None, "the config enables the API"
    return daemon.api.bound[1]


def api_base(daemon: Daemon) -> str:
    """The API's base URL, as bound (the config asks for port 0)."""
    assert daemon.api is not None and daemon.api.bound is not None, "the config enables the API"
    host, port = daemon.api.bound
    return f"http://{host}:{port}"


def bearer(secret: str) -> dict[str, str]:
    """The header that authenticates an API request."""
    return {"Authorization": f"Bearer {secret}"}


def metric_samples(text: str) -> dict[tuple[str, frozenset], float]:
    """(sample name, labels) -> value of a Prometheus exposition, through prometheus_client's own
    parser; a series that appears twice fails the test."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = sample.value
    return out
