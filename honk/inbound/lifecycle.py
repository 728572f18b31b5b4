"""The listener lifecycle in one call, for what runs a listener outside the applier."""

from __future__ import annotations


class BindThenServe:
    """``start()`` for a listener with the applier's two-step lifecycle (``bind`` without
    serving, then ``serve``): tests and tools that need no prepare/commit split use it."""

    async def start(self) -> None:
        """:meth:`bind` then :meth:`serve`; a failure to serve releases what was bound."""
        await self.bind()  # type: ignore[attr-defined]
        try:
            await self.serve()  # type: ignore[attr-defined]
        except BaseException:
            await self.stop_accepting()  # type: ignore[attr-defined]
            raise
