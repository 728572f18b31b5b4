import importlib

import pytest

from honk._fast import NO_EXTENSIONS

IMPLS = [pytest.param("py", id="py")]
if not NO_EXTENSIONS:
    IMPLS.append(pytest.param("c", id="c", marks=pytest.mark.compiled))


def load(kernel: str, impl: str):
    """Import one implementation of a kernel; a missing compiled build fails the test."""
    return importlib.import_module(f"honk._fast.{kernel}_{impl}")


@pytest.fixture(params=IMPLS)
def movavg_mod(request):
    return load("movavg", request.param)


@pytest.fixture(params=IMPLS)
def ring_mod(request):
    return load("ring", request.param)


@pytest.fixture(params=IMPLS)
def decay_mod(request):
    return load("decay", request.param)


@pytest.fixture(params=IMPLS)
def beta_mod(request):
    return load("beta", request.param)


@pytest.fixture(params=IMPLS)
def cell_mod(request):
    return load("cell", request.param)


@pytest.fixture(params=IMPLS)
def rank_mod(request):
    return load("rank", request.param)


@pytest.fixture(params=IMPLS)
def nodeid_mod(request):
    return load("nodeid", request.param)


@pytest.fixture(params=IMPLS)
def valuetype_mod(request):
    return load("valuetype", request.param)
