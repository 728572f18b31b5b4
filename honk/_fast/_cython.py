"""What the kernels' pure-Python twins use of the ``cython`` module, for a run without Cython.

The ``<name>_py.py`` kernels are also the Cython sources of the compiled ``<name>_c`` modules, and
read ``cython.compiled`` to keep the parts each build needs. Cython is a build dependency only: an
installed honk may run without it, so each of those files imports ``cython`` inside
``try``/``except ModuleNotFoundError`` and falls back to this module. The compiler resolves
``import cython`` itself and drops the fallback, so the compiled build is unchanged.

Only what the twins use is here (``tests/unit/_fast/test_cython_fallback.py`` checks that every
``cython.<name>`` a twin reads exists); add a name the day a twin needs it.
"""

compiled = False  # the twin runs as plain Python
