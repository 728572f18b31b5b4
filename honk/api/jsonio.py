"""JSON out of the API, without holding the event loop.

A dashboard polls listings of every node (``/proxies``, ``/providers/proxies``,
``/v1/nodes``); with thousands of nodes, building and encoding one such body in one
go holds the event loop long enough for new flows to wait on it. Listings are
therefore encoded one object at a time, :data:`ENCODE_SLICE` objects per loop turn
(:func:`encode_each`), and sent as a chunked body, a slice of objects per write
(:func:`stream_json`), so neither building, joining nor sending holds the loop for more
than a slice.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from aiohttp import web

ENCODE_SLICE = 50  # objects built and encoded per event-loop turn (2-6 ms of work on this machine)

T = TypeVar("T")


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def reply(value: Any, status: int = 200) -> web.Response:
    return web.json_response(value, status=status, dumps=dumps)


def text_reply(text: str, status: int = 200) -> web.Response:
    """A body already encoded as JSON."""
    return web.Response(text=text, status=status, content_type="application/json")


async def encode_each(items: Iterable[T], encode: Callable[[T], str]) -> list[str]:
    """``encode(item)`` for every item, yielding to the loop after every :data:`ENCODE_SLICE`."""
    out = []
    for count, item in enumerate(items, 1):
        out.append(encode(item))
        if count % ENCODE_SLICE == 0:
            await asyncio.sleep(0)
    return out


async def stream_json(request: web.Request, head: str, parts: list[str], tail: str) -> web.StreamResponse:
    """Send ``head``, the comma-separated ``parts`` and ``tail`` as one JSON body, chunked, a
    slice of parts per write (each write waits for the socket to drain)."""
    response = web.StreamResponse(headers={"Content-Type": "application/json; charset=utf-8"})
    await response.prepare(request)
    for start in range(0, max(len(parts), 1), ENCODE_SLICE):
        chunk = ",".join(parts[start : start + ENCODE_SLICE])
        text = (head if start == 0 else ",") + chunk
        if start + ENCODE_SLICE >= len(parts):
            text += tail
        await response.write(text.encode())
        await asyncio.sleep(0)  # a write into a socket with room does not yield by itself
    await response.write_eof()
    return response
