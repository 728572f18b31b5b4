"""docs/configuration.md against the parser, both ways, so the reference cannot drift.

The page's tables are read as data: under each ``## <section path>`` heading, a table whose
first column is ``key`` lists that section's keys with the dialects that read them (``in``)
and an example value; other tables list forms (routing predicates, group policies, link
schemes, ...) by their first column, most with an example. Every documented key and form is
fed to the loader (or to the form's own parser) and must load with no error and no
unknown-key; every key and form the parser's own tables know must be documented.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers.geodata import write_geodata

from honk.config import build, dae, dns, links, structured, validate
from honk.config import expr as E
from honk.config.assets import GEODATA_BLOCK, GEODATA_URL_KEYS, ROUTE_KEY, UNHONOURED_BLOCKS
from honk.config.diagnostics import ConfigError
from honk.config.load import load_text
from honk.config.spec import POLICY_SPELLINGS, TRAFFIC_PREDICATES, GlobalSpec

DOC = Path(__file__).resolve().parents[3] / "docs" / "configuration.md"

# diagnostics that mean "the parser did not take this as written"
REFUSED_CODES = frozenset(
    {
        "unknown-key",
        "unknown-section",
        "unknown-block",
        "unknown-policy",
        "unparseable-filter",
        "invalid-statement",
        "missing-arrow",
    }
)
NODE = "socks5://192.0.2.1:1080"  # node n1, which examples may name


# --- reading the page -------------------------------------------------------------------------


@dataclass
class Table:
    section: str  # the heading the table is under
    kind: str  # its first column's title
    rows: list[dict[str, str]]  # cells by column title, plus "name": the first cell's code

    def names(self) -> set[str]:
        return {r["name"] for r in self.rows}


def _cells(line: str) -> list[str]:
    cells = re.split(r"(?<!\\)\|", line.strip())[1:-1]
    return [c.strip().replace("\\|", "|") for c in cells]


def _code(cell: str) -> str | None:
    m = re.search(r"`([^`]*)`", cell)
    return m.group(1) if m else None


def read_tables(text: str) -> list[Table]:
    tables: list[Table] = []
    section = ""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        if (
            line.startswith("|")
            and i + 1 < len(lines)
            and re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", lines[i + 1].strip())
        ):
            header = _cells(line)
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                cells = _cells(lines[i])
                row = dict(zip(header, cells, strict=True))
                row["name"] = _code(cells[0]) or cells[0]
                rows.append(row)
                i += 1
            tables.append(Table(section, header[0], rows))
            continue
        i += 1
    return tables


TEXT = DOC.read_text(encoding="utf-8")
TABLES = read_tables(TEXT)


def table(section: str, kind: str) -> Table:
    found = [t for t in TABLES if t.section == section and t.kind == kind]
    assert len(found) == 1, f"docs/configuration.md: expected one '{kind}' table under '## {section}'"
    return found[0]


def section_text(section: str) -> str:
    m = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", TEXT, re.M | re.S)
    assert m, f"docs/configuration.md has no '## {section}'"
    return m.group(1)


KEY_TABLES = [t for t in TABLES if t.kind == "key"]
KEY_ROWS = [(t.section, row) for t in KEY_TABLES if t.section != "sections" for row in t.rows]


def example(row: dict[str, str]) -> str:
    value = _code(row.get("example", ""))
    assert value is not None, f"{row['name']}: the example cell needs a `value`"
    return value


# --- building a configuration around one key ------------------------------------------------

# sections whose entries are named: the test's entry name
NAMED = {"inbound": "lan", "node": "n2", "subscription": "s1", "group": "g", "dns.upstream": "default"}
# the fields a section needs besides the key under test
BASE = {
    "subscription": {"url": "'https://sub.example/token'"},
    "group": {"filter": "name(n1)", "policy": "min_moving_avg"},
    "dns.upstream": {"url": "'udp://9.9.9.9:53'"},
}


def _unquote(value: str) -> str:
    v = value.strip()
    return v[1:-1] if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"" else v


def _block(value: str) -> tuple[str, str] | None | bool:
    """A ``{}`` (True) or ``{ key: value }`` (the pair) example; False for a plain value."""
    v = value.strip()
    if not (v.startswith("{") and v.endswith("}")):
        return False
    inner = v[1:-1].strip()
    if not inner:
        return None
    key, _, val = inner.partition(":")
    return key.strip(), val.strip()


def _toml_value(value: str) -> str:
    v = value.strip()
    if re.fullmatch(r"-?\d+", v) or v in ("true", "false", "[]"):
        return v
    return json.dumps(_unquote(v))


def _path(section: str) -> list[str]:
    return section.split(".") + ([NAMED[section]] if section in NAMED else [])


def dae_text(section: str, fields: dict[str, str]) -> str:
    path = _path(section)
    body = []
    for key, value in fields.items():
        block = _block(value)
        if block is False:
            body.append(f"{key}: {value}")
        else:
            body += [f"{key} {{", *([f"    {block[0]}: {block[1]}"] if block else []), "}"]
    text = "\n".join(body)
    for name in reversed(path):
        text = f"{name} {{\n" + "\n".join("    " + line for line in text.split("\n")) + "\n}"
    return f"node {{\n    n1: '{NODE}'\n}}\n{text}\n"


def toml_text(section: str, fields: dict[str, str]) -> str:
    head = ".".join(_path(section))
    scalars, tables = [], []
    for key, value in fields.items():
        block = _block(value)
        if block is False:
            scalars.append(f"{json.dumps(key)} = {_toml_value(value)}")
        else:
            tables += [
                f"[{head}.{key}]",
                *([f"{json.dumps(block[0])} = {_toml_value(block[1])}"] if block else []),
            ]
    return "\n".join([f'[node]\nn1 = "{NODE}"', f"[{head}]", *scalars, *tables]) + "\n"


def assert_loads(text: str, fmt: str, what: str) -> None:
    try:
        spec = load_text(text, fmt)
    except ConfigError as exc:
        pytest.fail(f"{what} ({fmt}) does not load:\n{exc}\n--- configuration:\n{text}")
    refused = [d for d in spec.diagnostics if d.code in REFUSED_CODES]
    assert not refused, f"{what} ({fmt}): {refused}\n--- configuration:\n{text}"


@pytest.fixture(autouse=True)
def _geodata(no_geodata: Path) -> None:
    """geosite.dat and geoip.dat in the working directory, for examples naming geodata codes."""
    write_geodata(no_geodata)


# --- every documented key loads --------------------------------------------------------------


@pytest.mark.parametrize(("section", "row"), KEY_ROWS, ids=[f"{s}.{r['name']}" for s, r in KEY_ROWS])
def test_every_documented_key_loads_with_its_example(section: str, row: dict[str, str]) -> None:
    dialects = row["in"].strip()
    assert dialects in ("both", "dae", "toml"), f"{section}.{row['name']}: 'in' is both, dae or toml"
    fields = {**BASE.get(section, {}), row["name"]: example(row)}
    if dialects in ("both", "dae"):
        assert_loads(dae_text(section, fields), "dae", f"{section}.{row['name']}")
    if dialects in ("both", "toml"):
        assert_loads(toml_text(section, fields), "toml", f"{section}.{row['name']}")


def test_every_documented_section_loads() -> None:
    for row in table("sections", "key").rows:
        name = row["name"]
        assert_loads(f"{name} {{\n}}\n", "dae", name)
        value = example(row)
        assert_loads(f"{name} = {value}\n" if value == "[]" else f"[{name}]\n", "toml", name)


# --- every key the parser knows is documented ------------------------------------------------


def _documented(section: str, *dialects: str) -> set[str]:
    rows = table(section, "key").rows
    return {r["name"] for r in rows if not dialects or r["in"].strip() in dialects}


PARSER_KEYS: dict[str, tuple[set[str], set[str] | None]] = {
    # section: (every key the parser accepts there, the subset the dae dialect reads; None: all)
    "sections": (set(dae.ROOT_SECTIONS), None),
    "global": (set(build.GLOBAL_KEYS), None),
    "inbound": ({structured.ENTRY_TABLE_FIELDS["inbound"]}, set()),
    "node": ({structured.ENTRY_TABLE_FIELDS["node"]}, set()),
    "subscription": (set(structured.SUBSCRIPTION_KEYS), set(structured.SUBSCRIPTION_KEYS.values())),
    "group": (set(build.STRUCTURED_GROUP_KEYS), set(build.DAE_GROUP_KEYS)),
    "routing": (set(structured.ROUTING_KEYS), set(structured.ROUTING_KEYS) - {"rules"}),
    "dns": (set(dns.DNS_SETTING_KEYS) | set(dns.DNS_BLOCKS), None),
    "dns.upstream": (set(dns.UPSTREAM_TABLE_KEYS), set()),
    # dae spells a phase's fallback `default:` too (build_dns reads the alias); TOML takes only these
    "dns.routing.request": (set(structured.DNS_PHASE_KEYS) | {"default"}, {"fallback", "default"}),
    "dns.routing.response": (set(structured.DNS_PHASE_KEYS) | {"default"}, {"fallback", "default"}),
    "experimental": (set(structured.EXPERIMENTAL_BLOCKS), None),
    "experimental.clash_api": (
        set(build.CLASH_API_KEYS | build.CLASH_API_BOOLS | build.CLASH_API_ACCEPTED),
        None,
    ),
    "experimental.cache_file": (set(build.CACHE_FILE_BOOLS | build.CACHE_FILE_STRINGS), None),
    "assets": ({ROUTE_KEY, GEODATA_BLOCK, *UNHONOURED_BLOCKS}, None),
    "assets.geodata": ({*GEODATA_URL_KEYS, ROUTE_KEY}, None),
}


@pytest.mark.parametrize("section", sorted(PARSER_KEYS))
def test_the_parsers_keys_are_the_documented_keys(section: str) -> None:
    accepted, dae_keys = PARSER_KEYS[section]
    documented = _documented(section)
    assert accepted - documented == set(), f"## {section}: keys the parser accepts but the page does not list"
    assert documented - accepted == set(), f"## {section}: keys the page lists but the parser does not know"
    in_dae = _documented(section, "both", "dae")
    assert in_dae == (accepted if dae_keys is None else dae_keys), f"## {section}: the 'in' column is wrong"


def test_every_key_table_is_checked() -> None:
    assert {t.section for t in KEY_TABLES} == set(PARSER_KEYS)


def test_the_global_keys_the_parser_reads_are_the_spec_fields() -> None:
    assert build.GLOBAL_SPEC_KEYS == {f.name for f in dataclasses.fields(GlobalSpec)}


def test_dns_upstream_names_are_a_dns_block() -> None:
    assert {"upstream", "routing", "fixed_domain_ttl"} == set(dns.DNS_BLOCKS)


# --- routing predicates, policies and filter terms -------------------------------------------


def test_every_routing_predicate_is_documented() -> None:
    known = set(TRAFFIC_PREDICATES) | set(E.PREDICATE_ALIASES) | {f"{name}:" for name in E._BARE_MATCHERS}
    documented = table("routing", "predicate").names()
    assert (sorted(known - documented), sorted(documented - known)) == ([], []), "(undocumented, unknown)"


@pytest.mark.parametrize("row", table("routing", "predicate").rows, ids=lambda r: r["name"])
def test_every_documented_predicate_parses(row: dict[str, str]) -> None:
    rule = example(row)
    assert_loads(f"routing {{\n    {rule} -> direct\n}}\n", "dae", row["name"])
    assert_loads(f"[routing]\nrules = [{json.dumps(rule + ' -> direct')}]\n", "toml", row["name"])


def test_every_group_policy_is_documented() -> None:
    documented, known = table("group", "policy").names(), set(POLICY_SPELLINGS)
    assert (sorted(known - documented), sorted(documented - known)) == ([], []), "(undocumented, unknown)"


@pytest.mark.parametrize("row", table("group", "policy").rows, ids=lambda r: r["name"])
def test_every_documented_policy_parses(row: dict[str, str]) -> None:
    fields = {"filter": "name(n1)", "policy": example(row)}
    assert_loads(dae_text("group", fields), "dae", row["name"])
    assert_loads(toml_text("group", fields), "toml", row["name"])


def test_every_filter_term_is_documented() -> None:
    assert {"name", "subtag", "group", *E.ANNOTATION_KEYS} <= table("group", "filter term").names()


@pytest.mark.parametrize("row", table("group", "filter term").rows, ids=lambda r: r["name"])
def test_every_documented_filter_term_parses(row: dict[str, str]) -> None:
    text = dae_text("group", {"filter": example(row)}) + "group {\n    other {\n    }\n}\n"
    assert_loads(text, "dae", row["name"])


# --- links, inbounds, subscriptions -----------------------------------------------------------


def test_every_node_scheme_is_documented() -> None:
    assert table("node", "scheme").names() == set(links.NODE_SCHEMES) | {"ss", *links.V2_SCHEMES}
    refused = section_text("node")
    assert all(f"`{scheme}`" in refused for scheme in links.KNOWN_UNSUPPORTED)


@pytest.mark.parametrize("row", table("node", "scheme").rows, ids=lambda r: r["name"])
def test_every_documented_node_link_parses(row: dict[str, str]) -> None:
    link = example(row)
    assert links.parse_node_link(link).protocol == links.NODE_SCHEMES.get(row["name"], row["name"])
    assert_loads(f"node {{\n    x: '{link}'\n}}\n", "dae", row["name"])


def _link_parameters() -> set[str]:
    """The query parameters links.py reads: its named constants and the keys its vless/trojan
    reader claims (read from its source, so a new claim shows up here)."""
    source = Path(links.__file__).read_text(encoding="utf-8")
    claimed = {k for call in re.findall(r"claims\(([^)]*)\)", source) for k in re.findall(r'"(\w+)"', call)}
    return (
        claimed
        | set(links.INSECURE_KEYS)
        | set(links.REALITY_KEYS)
        | set(links.DISPLAY_PARAMS)
        | {links.CA_KEY, links.MUX_PARAM, links.DRAIN_PARAM, "plugin"}
    )


def test_every_link_parameter_is_documented() -> None:
    assert table("node", "parameter").names() == _link_parameters()


def test_every_vmess_field_is_documented() -> None:
    source = Path(links.__file__).read_text(encoding="utf-8")
    read = set(re.findall(r'_json_text\(obj, "(\w+)"\)', source)) | {links.MUX_PARAM}
    documented = table("node", "field").names()
    assert read <= documented and documented - read <= {"v"}


def test_every_inbound_scheme_and_parameter_is_documented() -> None:
    assert table("inbound", "scheme").names() == set(links.INBOUND_SCHEMES)
    assert table("inbound", "parameter").names() == {links.INBOUND_OPEN_PARAM}
    for row in table("inbound", "scheme").rows + table("inbound", "parameter").rows:
        links.parse_inbound_url(example(row))


def test_every_subscription_scheme_is_documented_and_loads() -> None:
    schemes = table("subscription", "scheme")
    assert schemes.names() == {*validate.SUBSCRIPTION_SCHEMES, "file", "https-file", "http-file"}
    for row in schemes.rows:
        assert_loads(f"subscription {{\n    s: '{example(row)}'\n}}\n", "dae", row["name"])


# --- dns -----------------------------------------------------------------------------------


def test_every_dns_form_is_documented_and_parses() -> None:
    binds = table("dns", "bind")
    assert binds.names() == {*dns.BIND_SCHEMES, "(none)"}
    for row in binds.rows:
        dns.parse_bind(example(row))
    upstreams = table("dns.upstream", "scheme")
    assert upstreams.names() == set(dns.UPSTREAM_SCHEMES)
    for row in upstreams.rows:
        dns.parse_upstream_uri(example(row))
    assert f"`?{dns.SERVER_NAME_PARAM}=NAME`" in section_text("dns.upstream")


@pytest.mark.parametrize(
    ("phase", "known", "target"),
    [
        ("request", {*dns.DNS_REQUEST_CONDITIONS, *dns.INTERNAL_SELECTORS}, "default"),
        ("response", set(dns.DNS_RESPONSE_CONDITIONS), "accept"),
    ],
)
def test_every_dns_condition_is_documented_and_parses(phase: str, known: set[str], target: str) -> None:
    conditions = table(f"dns.routing.{phase}", "condition")
    assert conditions.names() == known
    for row in conditions.rows:
        rule = f"{example(row)} -> {target}"
        assert_loads(
            f"dns {{\n    routing {{\n        {phase} {{\n            {rule}\n        }}\n    }}\n}}\n",
            "dae",
            row["name"],
        )
        assert_loads(f"[dns.routing.{phase}]\nrules = [{json.dumps(rule)}]\n", "toml", row["name"])
    if phase == "request":
        text = section_text("dns.routing.request")
        assert all(f"`{key}`" in text for keys in dns.DNS_OWN_KEYS.values() for key in keys if key)


# --- the page reads as intended -------------------------------------------------------------


def test_the_readme_points_here() -> None:
    readme = (DOC.parents[1] / "README.md").read_text(encoding="utf-8")
    assert "docs/configuration.md" in readme
