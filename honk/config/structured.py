"""TOML and JSON readers: the same schema as the dae dialect, as data.

Layout (TOML shown; a JSON document is the same object)::

    include = ["conf.d/*.toml"]      # optional; same rules as dae include, same format as the entry

    [global]
    log_level = "info"
    check_interval = "30s"           # string duration, or a number: seconds for second
    check_tolerance = "50ms"         #   settings, milliseconds for millisecond settings
    connect_timeout = 3000
    tcp_check_url = ["https://www.gstatic.com/generate_204"]   # list, or a comma string
    udp_check_dns = "dns.google:53, 8.8.8.8"
    max_concurrent_dials = 64
    data_dir = "./var"               # relative -> resolved against the entry file's directory

    [inbound]
    lan = "mixed://127.0.0.1:7890"   # name = url, or a table: [inbound.lan] url = "..."

    [node]
    edge = "socks5://10.0.0.1:1080"  # tag = link, or a table: [node.edge] link = "..."
    # node = ["socks5://..."]        # alternatively a list of untagged links

    [group.proxy]
    policy = "select"
    filter = ["name(edge)", "group(hk)"]   # each string is one dae filter line (or one string)
    default = "edge"
    final = "block"
    check_url = "https://..."
    tolerance = 50                   # structured-only: milliseconds (number) or "50ms";
                                     #   absent -> global check_tolerance
    idle_timeout = 1800              # structured-only: seconds (number) or "30m"
    id = "9b2a..."                   # structured-only: UUID

    [routing]
    rules = ["domain(suffix: ads.example) -> block", "dport(22) -> direct"]
    fallback = "proxy"               # "default" is an alias

    [experimental.clash_api]
    external_controller = "127.0.0.1:9090"
    external_ui = ""
    secret = ""
    default_mode = "Rule"

    [experimental.cache_file]
    enabled = true

    [subscription]
    paid = "https://sub.example/token"   # name = url, or a table:
    [subscription.backup]
    url = "https://other.example/sub"
    ua = "clash"                     # User-Agent override ("user_agent" also works)
    interval = "12h"                 # seconds (number) or a duration; 0 disables refreshing
    cache = false                    # keep the body out of the subscription store
    # or a list of tables that each name themselves:
    # [[subscription]]  name = "paid"  url = "https://..."

    [dns]                            # the DNS reference's keys; see honk/config/dns.py
    bind = "udp://127.0.0.1:5353"
    [dns.upstream]
    default = "udp://223.5.5.5:53"
    proxied = "tcp://1.1.1.1:53 -> proxy"   # or a table: { url = "...", outbound = "proxy" }
    [dns.routing.request]
    rules = ["qname(suffix: lan) -> reject"]
    fallback = "default"
    [dns.fixed_domain_ttl]
    "ddns.example.org" = 10

Values that take text in dae take strings here; rule and filter strings use the
dae expression grammar. Neither tomllib nor json reports positions, so
:class:`Locator` scans the source text to find the line of each key path.
"""

from __future__ import annotations

import json
import re
import tomllib
from typing import Any

from honk.config.assets import structured_entries as assets_entries
from honk.config.diagnostics import SourceLoc
from honk.config.tree import Doc, Entry, GroupDecl, Sink, SubscriptionDecl, join_path

Path = tuple[str | int, ...]


# --- locating key paths in source text -------------------------------------------------


class Locator:
    """Maps key paths to 1-based source lines (longest known prefix wins)."""

    def __init__(self, lines: dict[Path, int]) -> None:
        self._lines = lines

    def line(self, path: Path) -> int:
        for cut in range(len(path), 0, -1):
            found = self._lines.get(path[:cut])
            if found:
                return found
        return 0

    @classmethod
    def for_json(cls, text: str) -> Locator:
        return cls(_scan_json(text))

    @classmethod
    def for_toml(cls, text: str) -> Locator:
        try:
            return cls(_scan_toml(text))
        except (IndexError, ValueError):  # a best-effort scan; lines are optional
            return cls({})


def _scan_json(text: str) -> dict[Path, int]:
    found: dict[Path, int] = {}
    # frames: [kind, path, key-or-index, expecting-key]
    stack: list[list[Any]] = []
    line = 1
    i, n = 0, len(text)

    def value_path() -> Path:
        if not stack:
            return ()
        top = stack[-1]
        return (*top[1], top[2])

    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif c in " \t\r:":
            i += 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            raw = text[i : j + 1]
            if stack and stack[-1][0] == "obj" and stack[-1][3]:
                try:
                    key = json.loads(raw)
                except ValueError:
                    key = raw.strip('"')
                stack[-1][2] = key
                stack[-1][3] = False
                found[(*stack[-1][1], key)] = line
            elif stack and stack[-1][0] == "arr":
                found[value_path()] = line
            i = j + 1
        elif c in "{[":
            path = value_path()
            if stack and stack[-1][0] == "arr":
                found[path] = line
            stack.append(["obj" if c == "{" else "arr", path, 0 if c == "[" else None, c == "{"])
            i += 1
        elif c in "}]":
            if stack:
                stack.pop()
            i += 1
        elif c == ",":
            if stack:
                if stack[-1][0] == "obj":
                    stack[-1][3] = True
                else:
                    stack[-1][2] += 1
            i += 1
        else:
            if stack and stack[-1][0] == "arr":
                found[value_path()] = line
            while i < n and text[i] not in ",}]\n \t\r":
                i += 1
    return found


def _dotted(text: str) -> Path:
    parts: list[str | int] = []
    for part in re.findall(r'"(?:[^"\\]|\\.)*"|\'[^\']*\'|[^.]+', text):
        part = part.strip()
        if len(part) >= 2 and part[0] in "\"'" and part[-1] == part[0]:
            part = part[1:-1]
        if part:
            parts.append(part)
    return tuple(parts)


def _scan_toml(text: str) -> dict[Path, int]:
    found: dict[Path, int] = {}
    table: Path = ()
    aot_counts: dict[Path, int] = {}
    lines = text.split("\n")
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln) + 1)
    k = 0
    while k < len(lines):
        lineno = k + 1
        s = lines[k].strip()
        k += 1
        if not s or s.startswith("#"):
            continue
        if s.startswith("[["):
            name = _dotted(s[2 : s.find("]]")])
            index = aot_counts.get(name, -1) + 1
            aot_counts[name] = index
            table = (*name, index)
            found.setdefault(name, lineno)
            found[table] = lineno
            continue
        if s.startswith("["):
            table = _dotted(s[1 : s.find("]")])
            found[table] = lineno
            continue
        eq = _key_end(s)
        if eq < 0:
            continue
        full = (*table, *_dotted(s[:eq]))
        found[full] = lineno
        rest = s[eq + 1 :].lstrip()
        indent = len(lines[k - 1]) - len(lines[k - 1].lstrip())
        start = starts[k - 1] + indent + eq + 1 + (len(s[eq + 1 :]) - len(rest))
        if rest.startswith("["):
            end_line = _scan_toml_array(text, start, lineno, full, found)
            k = max(k, end_line)
        elif rest.startswith("{"):
            for m in re.finditer(r"([A-Za-z0-9_\-]+|\"[^\"]*\")\s*=", rest):
                found[(*full, *_dotted(m.group(1)))] = lineno
        elif rest.startswith(('"""', "'''")):
            quote = rest[:3]
            if rest.count(quote) < 2:
                while k < len(lines) and quote not in lines[k]:
                    k += 1
                k += 1
    return found


def _key_end(s: str) -> int:
    q = ""
    for i, c in enumerate(s):
        if q:
            if c == q:
                q = ""
        elif c in "\"'":
            q = c
        elif c == "=":
            return i
    return -1


def _scan_toml_array(text: str, start: int, line: int, path: Path, found: dict[Path, int]) -> int:
    """Record the line of each element of the array opening at ``start``;
    returns the line the array ends on."""
    depth = 0
    index = 0
    expecting = True
    i, n = start, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
            continue
        if c in " \t\r":
            i += 1
            continue
        if c == "#":
            while i < n and text[i] != "\n":
                i += 1
            continue
        if c == "[":
            if depth == 1 and expecting:
                found[(*path, index)] = line
                expecting = False
            depth += 1
            i += 1
            continue
        if c == "]":
            depth -= 1
            i += 1
            if depth == 0:
                return line
            continue
        if c == ",":
            if depth == 1:
                index += 1
                expecting = True
            i += 1
            continue
        if depth == 1 and expecting:
            found[(*path, index)] = line
            expecting = False
        if c in "\"'":
            triple = text.startswith(c * 3, i)
            if triple:
                j = text.find(c * 3, i + 3)
                j = n if j < 0 else j + 3
            else:
                j = i + 1
                while j < n and text[j] != c and text[j] != "\n":
                    j += 2 if (c == '"' and text[j] == "\\") else 1
                j += 1
            line += text.count("\n", i, min(j, n))
            i = j
            continue
        i += 1
    return line


# --- reading -------------------------------------------------------------------------


def parse(text: str, fmt: str, file: str, sink: Sink) -> tuple[dict[str, Any] | None, Locator]:
    """Decode TOML or JSON text; syntax errors become one located ``syntax`` error."""
    if fmt == "toml":
        try:
            data: Any = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            m = re.search(r"line (\d+)", str(exc))
            sink.error("syntax", "document", "not valid TOML", SourceLoc(file, int(m.group(1)) if m else 0))
            return None, Locator({})
        except (RecursionError, ValueError):
            sink.error("syntax", "document", "not valid TOML", SourceLoc(file, 0))
            return None, Locator({})
        return data, Locator.for_toml(text)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        sink.error("syntax", "document", f"not valid JSON: {exc.msg}", SourceLoc(file, exc.lineno))
        return None, Locator({})
    except (RecursionError, ValueError):
        sink.error("syntax", "document", "not valid JSON", SourceLoc(file, 0))
        return None, Locator({})
    if not isinstance(data, dict):
        sink.error("invalid-type", "document", "a JSON configuration must be an object", SourceLoc(file, 1))
        return None, Locator({})
    return data, Locator.for_json(text)


# Keys of a structured subscription table -> the setting they give (the dae block
# form's names, plus the upstream model's names as aliases).
SUBSCRIPTION_KEYS = {
    "url": "url",
    "ua": "ua",
    "user_agent": "ua",
    "interval": "interval",
    "update_interval": "interval",
    "cache": "cache",
    "detour": "detour",
}


# The keys of the tables whose keys are fixed (any other is an unknown-key warning); the
# subscription table's are SUBSCRIPTION_KEYS. docs/configuration.md lists each (its drift test reads these).
ENTRY_TABLE_FIELDS = {"inbound": "url", "node": "link"}  # [inbound.NAME] url = ..., [node.NAME] link = ...
ROUTING_KEYS = frozenset({"rules", "fallback", "default"})  # [routing]; default is fallback's other name
DNS_PHASE_KEYS = frozenset({"rules", "fallback"})  # [dns.routing.request] and [dns.routing.response]
EXPERIMENTAL_BLOCKS = ("clash_api", "cache_file")


class _Reader:
    def __init__(self, fmt: str, file: str, locator: Locator, sink: Sink) -> None:
        self.doc = Doc(file=file, fmt=fmt)
        self.file = file
        self.locator = locator
        self.sink = sink

    def loc(self, *path: str | int) -> SourceLoc:
        return SourceLoc(self.file, self.locator.line(tuple(path)))

    def entry(self, key: str | None, value: object, *path: str | int, shown: Path | None = None) -> Entry:
        return Entry(key, value, join_path(*(shown if shown is not None else path)), self.loc(*path))

    def table(self, value: object, *path: str | int) -> dict[str, Any] | None:
        if isinstance(value, dict):
            return value
        self.sink.error("invalid-type", join_path(*path), "expected a table", self.loc(*path))
        return None

    def unknown(self, *path: str | int) -> None:
        self.sink.warning("unknown-key", join_path(*path), "unknown key is ignored", self.loc(*path))

    def read(self, data: dict[str, Any]) -> Doc:
        doc = self.doc
        for name, value in data.items():
            if name == "include":
                items = [value] if isinstance(value, str) else value
                if not isinstance(items, list):
                    self.sink.error(
                        "invalid-type", "include", "expected a list of paths", self.loc("include")
                    )
                    continue
                for i, item in enumerate(items):
                    doc.includes.append(self.entry(None, item, "include", i))
            elif name == "global":
                tbl = self.table(value, "global")
                for key, v in (tbl or {}).items():
                    doc.global_.append(self.entry(key, v, "global", key))
            elif name in ("inbound", "node"):
                self.read_entries(name, value)
            elif name == "group":
                tbl = self.table(value, "group")
                for gname, body in (tbl or {}).items():
                    self.read_group(gname, body)
            elif name == "routing":
                self.read_routing(value)
            elif name == "experimental":
                self.read_experimental(value)
            elif name == "subscription":
                self.read_subscriptions(value)
            elif name == "dns":
                self.read_dns(value)
            elif name == "assets":
                self.doc.assets.extend(assets_entries(value, self.entry, self.table))
            else:
                self.sink.warning("unknown-section", name, "unknown section is skipped", self.loc(name))
        return doc

    def read_entries(self, section: str, value: object) -> None:
        field = ENTRY_TABLE_FIELDS[section]
        target = self.doc.inbounds if section == "inbound" else self.doc.nodes
        if isinstance(value, list):
            for i, item in enumerate(value):
                target.append(self.entry(None, item, section, i))
            return
        tbl = self.table(value, section)
        for tag, body in (tbl or {}).items():
            if isinstance(body, dict):
                for extra in body:
                    if extra != field:
                        self.unknown(section, tag, extra)
                if field not in body:
                    self.sink.error(
                        "missing-value",
                        join_path(section, tag),
                        f"expected a '{field}' key",
                        self.loc(section, tag),
                    )
                    continue
                target.append(self.entry(tag, body[field], section, tag, field, shown=(section, tag)))
            else:
                target.append(self.entry(tag, body, section, tag))

    def read_subscriptions(self, value: object) -> None:
        """A table of ``name = url`` / ``[subscription.name]`` tables, or a list of
        tables that each carry their ``name``."""
        if isinstance(value, list):
            for i, item in enumerate(value):
                tbl = self.table(item, "subscription", i)
                if tbl is None:
                    continue
                name = tbl.get("name")
                if not isinstance(name, str):
                    self.sink.error(
                        "missing-value",
                        join_path("subscription", i),
                        "a subscription needs a 'name' string",
                        self.loc("subscription", i),
                    )
                    continue
                fields = {k: v for k, v in tbl.items() if k != "name"}
                self.read_subscription(name, fields, ("subscription", i))
            return
        tbl = self.table(value, "subscription")
        for name, body in (tbl or {}).items():
            if isinstance(body, dict):
                self.read_subscription(name, body, ("subscription", name))
            else:
                path = join_path("subscription", name)
                entry = self.entry("url", body, "subscription", name)
                self.doc.subscriptions.append(
                    SubscriptionDecl(name, path, entry.loc, [entry], structured=True)
                )

    def read_subscription(self, name: str, body: dict[str, Any], where: Path) -> None:
        entries: list[Entry] = []
        for key, v in body.items():
            canonical = SUBSCRIPTION_KEYS.get(key)
            if canonical is None:
                self.unknown(*where, key)
                continue
            entries.append(self.entry(canonical, v, *where, key))
        path = join_path(*where)
        self.doc.subscriptions.append(
            SubscriptionDecl(name, path, self.loc(*where), entries, structured=True)
        )

    def read_group(self, name: str, body: object) -> None:
        tbl = self.table(body, "group", name)
        if tbl is None:
            return
        decl = GroupDecl(name, join_path("group", name), self.loc("group", name), structured=True)
        for key, value in tbl.items():
            if key == "filter":
                items = [value] if isinstance(value, str) else value
                if not isinstance(items, list):
                    self.sink.error(
                        "invalid-type",
                        join_path("group", name, "filter"),
                        "expected a list of filter lines",
                        self.loc("group", name, "filter"),
                    )
                    continue
                for i, item in enumerate(items):
                    decl.entries.append(self.entry("filter", item, "group", name, "filter", i))
            else:
                decl.entries.append(self.entry(key, value, "group", name, key))
        self.doc.groups.append(decl)

    def read_routing(self, value: object) -> None:
        tbl = self.table(value, "routing")
        for key, v in (tbl or {}).items():
            if key == "rules":
                items = [v] if isinstance(v, str) else v
                if not isinstance(items, list):
                    self.sink.error(
                        "invalid-type",
                        "routing.rules",
                        "expected a list of rules",
                        self.loc("routing", "rules"),
                    )
                    continue
                for i, item in enumerate(items):
                    self.doc.rules.append(self.entry(None, item, "routing", "rules", i))
            elif key in ROUTING_KEYS:  # fallback or default
                self.doc.fallbacks.append(
                    self.entry("fallback", v, "routing", key, shown=("routing", "fallback"))
                )
            else:
                self.unknown("routing", key)

    def read_dns(self, value: object) -> None:
        """The ``dns`` table as entries (the key scheme is described on ``Doc.dns``)."""
        tbl = self.table(value, "dns")
        if tbl is None:
            return
        out = [self.entry(None, None, "dns")]
        for key, v in tbl.items():
            if key in ("upstream", "fixed_domain_ttl"):
                sub = self.table(v, "dns", key)
                if key == "upstream":
                    out.append(self.entry("upstream", None, "dns", key))
                out.extend(self.entry(f"{key}.{k}", x, "dns", key, k) for k, x in (sub or {}).items())
            elif key == "routing":
                for phase, body in (self.table(v, "dns", key) or {}).items():
                    if phase not in ("request", "response"):
                        self.unknown("dns", key, phase)
                        continue
                    out.extend(self.read_dns_phase(phase, body))
            else:
                out.append(self.entry(key, v, "dns", key))
        self.doc.dns = (self.doc.dns or []) + out

    def read_dns_phase(self, phase: str, body: object) -> list[Entry]:
        out: list[Entry] = []
        for key, v in (self.table(body, "dns", "routing", phase) or {}).items():
            if key not in DNS_PHASE_KEYS:
                self.unknown("dns", "routing", phase, key)
            elif key == "fallback":
                out.append(self.entry(f"{phase}.fallback", v, "dns", "routing", phase, key))
            elif key == "rules":
                items = [v] if isinstance(v, str) else v
                if not isinstance(items, list):
                    self.sink.error(
                        "invalid-type",
                        join_path("dns", "routing", phase, "rules"),
                        "expected a list of rules",
                        self.loc("dns", "routing", phase, "rules"),
                    )
                    continue
                out.extend(
                    self.entry(
                        phase, item, "dns", "routing", phase, "rules", i, shown=("dns", "routing", phase, i)
                    )
                    for i, item in enumerate(items)
                )
            else:
                self.unknown("dns", "routing", phase, key)
        return out

    def read_experimental(self, value: object) -> None:
        tbl = self.table(value, "experimental")
        for key, v in (tbl or {}).items():
            if key not in EXPERIMENTAL_BLOCKS:
                self.sink.error(
                    "unknown-block",
                    join_path("experimental", key),
                    "experimental holds only clash_api and cache_file",
                    self.loc("experimental", key),
                )
                continue
            sub = self.table(v, "experimental", key)
            entries = [self.entry(k, x, "experimental", key, k) for k, x in (sub or {}).items()]
            if key == "clash_api":
                self.doc.clash_api = (self.doc.clash_api or []) + entries
            else:
                self.doc.cache_file = (self.doc.cache_file or []) + entries


def read(text: str, fmt: str, file: str, sink: Sink) -> Doc | None:
    data, locator = parse(text, fmt, file, sink)
    if data is None:
        return None
    return _Reader(fmt, file, locator, sink).read(data)
