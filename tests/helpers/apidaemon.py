"""A running daemon with its API on loopback, the .dae blocks that every control-surface test
repeats around its own nodes, groups and routing, and the parsed text of a /metrics answer.

The blocks are plain text with single braces: compose them with a test's own text after that
text's ``.format`` (a block put inside a ``.format`` template would need its braces doubled).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from honk.core.clock import Clock
from honk.daemon.app import Daemon

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


@contextlib.asynccontextmanager
async def running_daemon(tmp_path: Path, config_text: str,
                         clock: Clock | None = None) -> AsyncIterator[Daemon]:
    """A daemon started from ``config_text`` written to ``tmp_path/honk.dae``, shut down on exit."""
    config = tmp_path / "honk.dae"
    config.write_text(config_text)
    daemon = Daemon(config, clock=clock)
    await daemon.start()
    await asyncio.wait_for(daemon.warm.rested(), WARM_SETTLE)  # its first warm-up passes done
    try:
        yield daemon
    finally:
        await daemon.shutdown(0.0)


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
