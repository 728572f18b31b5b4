"""tests/corpus/dae: configurations in the forms real dae and upstream honk users write (each
file names the public source it models), each run through what ``honk check`` runs -- load,
lower, plan from empty, prepare without binding -- against geodata the test built."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from honk.config.diagnostics import Severity
from honk.config.load import load_file
from honk.daemon.app import check_spec

CORPUS = Path(__file__).resolve().parents[2] / "corpus" / "dae"
CORPUS_FILES = sorted(CORPUS.glob("*.dae"))


# Each case starts with one `# source: <owner>/<repo>/<path>` line per public source it models
# (a repository file or a documentation page), then `# ` lines saying which forms.
SOURCE_LINE = re.compile(r"^# source: (\S+/\S+/\S+)$")
MIN_SOURCES = 20

# Keys honk refuses on purpose (README's list), kept in the cases that model a file using
# them: each must come out as exactly this counted warning, never silently.
EXPECTED_WARNINGS: dict[str, list[str]] = {
    "node_named_group.dae": ["global.allow_insecure not-honoured"],
    "nix_include_must_list.dae": [
        "global.tls_implementation not-honoured",
        "global.utls_imitate not-honoured",
        "global.enable_local_tcp_fast_redirect not-honoured",
        "global.mptcp not-honoured",
    ],
    "split_by_service.dae": ["global.tls_implementation not-honoured", "global.utls_imitate not-honoured"],
    "glued_blocks_must_groups.dae": [
        "global.tls_implementation not-honoured",
        "global.utls_imitate not-honoured",
    ],
    "stray_group_comments.dae": ["global.allow_insecure not-honoured"],
}


def sources(path: Path) -> list[str]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        found = SOURCE_LINE.match(line)
        if found is None:
            break
        out.append(found.group(1))
    return out


def test_the_corpus_has_a_case_for_every_form():
    names = {p.name for p in CORPUS_FILES}
    assert {
        "continued_rules.dae",
        "glued_braces.dae",
        "must_outbounds.dae",
        "dscp_bases.dae",
        "dae_aliases.dae",
        "geodata_rules.dae",
        "group_checks.dae",
        "upstream_honk_config.dae",
        "upstream_routing_reference.dae",
        "upstream_groups_reference.dae",
        "node_named_group.dae",
        "nix_desktop_ip_mode.dae",
        "nix_include_must_list.dae",
        "commented_upstreams.dae",
        "split_by_service.dae",
        "glued_blocks_must_groups.dae",
        "expiry_filter.dae",
        "tab_subscription_url_tag.dae",
        "stray_group_comments.dae",
        "dns_routing_reference.dae",
    } <= names
    for path in CORPUS_FILES:
        text = path.read_text(encoding="utf-8")
        assert sources(path), path.name  # names the source it models
        assert text.splitlines()[len(sources(path))].startswith("# "), path.name  # and what forms


def test_the_corpus_models_at_least_twenty_distinct_public_sources():
    named = {source for path in CORPUS_FILES for source in sources(path)}
    assert len(named) >= MIN_SOURCES, sorted(named)


@pytest.mark.parametrize("path", CORPUS_FILES, ids=[p.name for p in CORPUS_FILES])
def test_every_corpus_case_passes_honk_check_without_a_problem(path, geodata):
    spec = load_file(path)  # raises ConfigError on any error
    warnings = sorted(f"{d.key_path} {d.code}" for d in spec.diagnostics if d.severity is Severity.WARNING)
    assert warnings == sorted(EXPECTED_WARNINGS.get(path.name, []))
    assert spec.routing.rules
    desired = asyncio.run(check_spec(spec, path))  # lower, plan, prepare: what `honk check` does
    assert desired.route.routing == spec.routing
