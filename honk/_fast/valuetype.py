"""Selects the value-type implementation; the rest of honk imports this."""

from typing import TYPE_CHECKING

from honk._fast import load

IMPLEMENTATION: str
if TYPE_CHECKING:
    from honk._fast.valuetype_py import install
else:
    _impl, IMPLEMENTATION = load("valuetype")
    install = _impl.install

__all__ = ["IMPLEMENTATION", "install"]
