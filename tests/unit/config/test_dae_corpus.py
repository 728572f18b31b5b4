"""tests/corpus/dae: configurations in the forms real dae and upstream honk users write (each
file names the public source it models), each run through what ``honk check`` runs -- load,
lower, plan from empty, prepare without binding -- against geodata the test built."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from honk.config.diagnostics import Severity
from honk.config.load import load_file
from honk.daemon.app import check_spec

CORPUS = Path(__file__).resolve().parents[2] / "corpus" / "dae"
CORPUS_FILES = sorted(CORPUS.glob("*.dae"))


def test_the_corpus_has_a_case_for_every_form():
    names = {p.name for p in CORPUS_FILES}
    assert {"continued_rules.dae", "glued_braces.dae", "must_outbounds.dae", "dscp_bases.dae",
            "dae_aliases.dae", "geodata_rules.dae", "group_checks.dae"} <= names
    for path in CORPUS_FILES:
        assert path.read_text(encoding="utf-8").startswith("# "), path.name  # names what it models


@pytest.mark.parametrize("path", CORPUS_FILES, ids=[p.name for p in CORPUS_FILES])
def test_every_corpus_case_passes_honk_check_without_a_problem(path, geodata):
    spec = load_file(path)  # raises ConfigError on any error
    assert [str(d) for d in spec.diagnostics if d.severity is Severity.WARNING] == []
    assert spec.routing.rules
    desired = asyncio.run(check_spec(spec, path))  # lower, plan, prepare: what `honk check` does
    assert desired.route.routing == spec.routing
