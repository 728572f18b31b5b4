"""Whole items out of a byte stream cut anywhere: the shared skeleton of the stream decoders.

A :class:`StreamSplitter` keeps the bytes of an incomplete item between feeds,
hands the rest to its subclass's ``_split`` and drops what that consumed. EOF
(``feed(b"")``) inside an item is the codec's ``truncated`` error; any failure is
sticky: the buffer is dropped and every later feed raises again, since a stream
that broke its framing cannot be resynchronised. Mux.Cool frames, VLESS and
Trojan UDP packets are split this way.
"""

from __future__ import annotations

from typing import ClassVar, Generic, NoReturn, TypeVar

from honk.core.errors import CodecError

__all__ = ["StreamSplitter"]

Item = TypeVar("Item")


class StreamSplitter(Generic[Item]):
    error: ClassVar[type[CodecError]]  # the codec's protocol error
    truncated: ClassVar[tuple[str, str]]  # (reason, detail) of an EOF inside an item
    stream: ClassVar[str] = "stream"  # what the sticky failure's detail calls the stream

    def __init__(self) -> None:
        self._buf = bytearray()
        self._failed: CodecError | None = None

    @property
    def pending(self) -> bool:
        """Whether part of an item is buffered: an EOF now truncates it."""
        return bool(self._buf)

    @property
    def failed(self) -> bool:
        return self._failed is not None

    def feed(self, data: bytes | bytearray | memoryview) -> list[Item]:
        """The items ``data`` completes; ``b""`` means EOF. Raises the codec's error."""
        if self._failed is not None:
            raise self.error(self._failed.reason, f"the {self.stream} already failed")
        if not data:
            if self._buf:
                self._fail(self.error(*self.truncated))
            return []
        buf = self._buf
        buf += data
        out: list[Item] = []
        del buf[: self._split(buf, out)]
        return out

    def _split(self, buf: bytearray, out: list[Item]) -> int:
        """Append the whole items at the start of ``buf`` to ``out``; how many bytes they took."""
        raise NotImplementedError

    def _fail(self, error: CodecError) -> NoReturn:
        self._failed = error
        self._buf = bytearray()
        raise error from None  # a lower codec's error (an address parser's, say) is not the story
