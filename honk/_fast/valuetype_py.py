"""Value types whose hash is stored: comparison and hashing done in C by the compiled build.

Score's cell keys and targets are small immutable objects looked up in dicts many times per
flow and per plan (an exact key, its two aggregates, the heuristic's rows). Each stores its
hash in a ``_hash`` slot when it is made, yet a Python ``__hash__`` that returns that slot
still costs a method lookup, a frame and an attribute read on every lookup, and a Python
``__eq__`` costs the same again whenever two distinct but equal keys meet.

:func:`install` takes such a class (``__slots__`` only, a ``_hash`` slot, equality meaning
"same class and every slot equal"): the compiled build points its ``tp_hash`` at a C function
that reads the stored hash and its ``tp_richcompare`` at one that compares the slots, the
stored hash first. The class keeps its Python ``__hash__``/``__eq__``, which this twin leaves
in place and which define the behaviour both builds must share.

This file is plain Python and also the Cython source of ``valuetype_c``; keep the two in step.
"""

try:
    import cython
except ModuleNotFoundError:  # an install without Cython: the twin's stand-in
    from honk._fast import _cython as cython


def install(cls: type) -> type:
    """Give ``cls`` the C hash and equality of its stored hash and slots (compiled build); the
    twin leaves its Python methods as they are. Returns ``cls``."""
    if cython.compiled:
        honk_install_value_type(cls)  # noqa: F821 - declared in valuetype_c.pxd
    return cls
