"""Property: any text either loads or raises ConfigError, quickly."""

from __future__ import annotations

import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from honk.config.diagnostics import ConfigError
from honk.config.load import load_text
from honk.config.spec import Spec

DATA = Path(__file__).parent / "data"
VALID = {fmt: (DATA / f"same.{fmt}").read_text() for fmt in ("dae", "toml")}

# characters that matter to the lexers, mixed with anything
_SYNTAX = st.sampled_from(list("{}()[]'\"#:,=!&|-> \n\t\\") + ["->", "&&", "(must)", "://", "\n}\n"])
_CHUNK = st.one_of(_SYNTAX, st.text(max_size=8))

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check(text: str, fmt: str) -> None:
    start = time.monotonic()
    try:
        result = load_text(text, fmt)
    except ConfigError as exc:
        assert exc.errors
    else:
        assert isinstance(result, Spec)
    assert time.monotonic() - start < 2.0


@FUZZ
@given(st.lists(_CHUNK, max_size=40).map("".join), st.sampled_from(["dae", "toml", "json"]))
def test_arbitrary_text_loads_or_raises_config_error(text, fmt):
    _check(text, fmt)


@st.composite
def _mutated(draw):
    fmt = draw(st.sampled_from(["dae", "toml"]))
    text = VALID[fmt]
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["delete", "duplicate", "insert"]))
        i = draw(st.integers(0, len(text)))
        j = min(len(text), i + draw(st.integers(1, 24)))
        if op == "delete":
            text = text[:i] + text[j:]
        elif op == "duplicate":
            text = text[:j] + text[i:j] + text[j:]
        else:
            text = text[:i] + draw(_CHUNK) + text[i:]
    return text, fmt


@FUZZ
@given(_mutated())
def test_mutations_of_a_valid_config_load_or_raise_config_error(case):
    text, fmt = case
    _check(text, fmt)
