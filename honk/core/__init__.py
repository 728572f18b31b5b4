"""Cross-cutting building blocks: addresses, networks, clocks and typed errors.

Nothing in this package performs I/O or imports an event loop, except the
real clock's ``sleep`` which awaits ``asyncio.sleep``.
"""
