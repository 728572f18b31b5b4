"""Group filter lines and routing rules: one grammar for both formats.

Filter line::

    term [&& term ...] [[annotation]]   term = [!]name(args) | [!]subtag(args)
                                        annotation = add_latency: <Go duration>
    group(tag, tag|tag)         standalone: nested groups (split on ',' and '|')

Routing rule::

    matcher [&& matcher ...] -> outbound[(param, ...)]
    matcher = [!]predicate(arg, ...) | [!]prefix:value   (bare prefix matcher)
    param = must | mark: N

dae's spellings are read as dae reads them: ``ip(...)`` and ``port(...)`` are
``dip(...)`` and ``dport(...)``, ``domain(contains: x)`` is ``keyword:``,
``-> must_<name>`` is ``-> <name>(must)``, ``-> must_rules`` is the marker
:data:`MUST_RULES`, and numbers (``dscp``, ``mark``) take Go's base prefixes.

Arguments are alternatives separated by commas; matching single or double
quotes keep ``,`` ``)`` ``&&`` and ``->`` literal. Only a recognised unquoted
``prefix:`` at an argument's head is split off, so ``dip(2001:db8::/32)`` and
``mac(00:11:22:33:44:55)`` stay whole. Argument values are validated per
predicate and stored normalised, so equal meaning gives equal specs.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterator
from dataclasses import dataclass

from honk.config.diagnostics import SourceLoc
from honk.config.spec import TRAFFIC_PREDICATES, FilterTerm, MatchArg, NodeFilter, Predicate, RuleSpec
from honk.config.tree import Sink
from honk.config.values import quote_mask, split_unquoted, unquote

ARG_PREFIXES = ("suffix", "full", "keyword", "regex", "geosite", "geoip", "domain", "ext")
_ARG_PREFIX = re.compile(r"^(suffix|full|keyword|regex|geosite|geoip|domain|ext)\s*:")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MUST_PREFIX = "must_"  # dae: ``-> must_x`` is ``-> x(must)``
# dae's ``-> must_rules``: not an outbound but "do not hijack this traffic's DNS and go on
# matching the following rules"; the router never ends its search at such a rule
MUST_RULES = "must_rules"
# dae's other names for a matcher and for a domain key (component/routing/optimizer.go,
# AliasOptimizer: dport -> port, dip -> ip, contains -> keyword; honk's names are dip, dport)
PREDICATE_ALIASES = {"ip": "dip", "port": "dport"}
_CONTAINS_ARG = re.compile(r"^contains\s*:")
DSCP_BITS = 8  # dae reads dscp with strconv.ParseUint(value, 0, 8)
DSCP_MAX = 63  # six DSCP bits of the ToS byte
MARK_BITS = 32  # dae reads a mark with strconv.ParseUint(value, 0, 32)


@dataclass(slots=True)
class Call:
    negated: bool
    name: str
    args: list[str] | None  # raw argument texts; None for a bare prefix matcher
    value: str = ""  # bare prefix matcher value (unquoted)


class ExprError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def matching_paren(text: str, open_index: int) -> int:
    """Index of the ')' closing the '(' at ``open_index`` (quotes respected), or -1."""
    mask, _ = quote_mask(text)
    depth = 0
    for i in range(open_index, len(text)):
        if mask[i]:
            continue
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return -1


def parse_call(term: str, *, bare_prefixes: bool) -> Call:
    """One ``[!]name(args)`` term (or ``[!]prefix:value`` when allowed)."""
    t = term.strip()
    negated = False
    if t.startswith("!"):
        negated = True
        t = t[1:].lstrip()
    if not t:
        raise ExprError("invalid-rule", "empty matcher")
    m = _IDENT.match(t)
    if not m:
        raise ExprError("unknown-traffic-predicate", "a matcher must start with its name")
    name = m.group()
    rest = t[m.end() :]
    if rest.startswith("("):
        close = matching_paren(rest, 0)
        if close < 0:
            raise ExprError("unterminated-matcher", "the matcher's argument list is not closed")
        if rest[close + 1 :].strip():
            raise ExprError("trailing-matcher-text", "text after a matcher's closing ')'")
        inner = rest[1:close]
        args = [a.strip() for a in split_unquoted(inner, ",")]
        return Call(negated, name, [a for a in args if a])
    stripped = rest.lstrip()
    if stripped.startswith("(") and rest != stripped:
        raise ExprError("unknown-traffic-predicate", "whitespace before a matcher's '(' is not allowed")
    if bare_prefixes and stripped.startswith(":") and name in ARG_PREFIXES:
        value = unquote(stripped[1:])
        if not value:
            raise ExprError("invalid-rule", "empty prefix matcher")
        return Call(negated, name, None, value)
    raise ExprError("unknown-traffic-predicate", "expected a matcher call such as dport(443)")


def split_arg(arg: str) -> MatchArg:
    m = _ARG_PREFIX.match(arg)
    if m:
        return MatchArg(m.group(1), unquote(arg[m.end() :]))
    return MatchArg("", unquote(arg))


def _compile(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        return False
    return True


# --- filters -------------------------------------------------------------------------


@dataclass(slots=True)
class FilterLine:
    kind: str  # "filter" | "groups" | "ignored"
    node_filter: NodeFilter | None = None
    groups: tuple[str, ...] = ()


# dae's filter annotation keys (component/outbound/dialer/annotation.go, NewAnnotation)
ANNOTATION_KEYS = ("add_latency",)
_GO_DURATION = re.compile(r"^([+-]?)((?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+)$")
_GO_PIECE = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_GO_UNIT_SECONDS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,
    "μs": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}


def parse_go_duration(text: str) -> float | None:
    """Go's ``time.ParseDuration`` (a sign, then number+unit pieces; ``0`` alone), in seconds."""
    s = text.strip()
    if s in ("0", "+0", "-0"):
        return 0.0
    m = _GO_DURATION.match(s) if len(s) <= 64 else None
    if m is None:
        return None
    value = sum(float(n) * _GO_UNIT_SECONDS[u] for n, u in _GO_PIECE.findall(m.group(2)))
    return -value if m.group(1) == "-" else value


def _split_annotation(text: str) -> tuple[str, str | None]:
    """``body [annotation]`` -> (body, annotation text); (text, None) without a trailing one. The
    ``[`` is the first unquoted one outside parentheses, so a regex's ``[a-z]`` stays in its call."""
    stripped = text.rstrip()
    mask, _ = quote_mask(stripped)
    if not stripped.endswith("]") or mask[len(stripped) - 1]:
        return text, None
    for i, ch in _top_level(stripped):
        if ch == "[":
            return stripped[:i], stripped[i + 1 : -1]
    return text, None


def _top_level(text: str) -> Iterator[tuple[int, str]]:
    """Each unquoted character of ``text`` outside any parentheses, with its index."""
    mask, _ = quote_mask(text)
    depth = 0
    for i, c in enumerate(text):
        if mask[i]:
            continue
        if c == "(":
            depth += 1
        elif c == ")":
            depth = max(depth - 1, 0)
        elif depth == 0:
            yield i, c


def _parse_annotation(inner: str, path: str, loc: SourceLoc, sink: Sink) -> float | None:
    """dae's filter annotation ``key: value, ...``: the ``add_latency`` offset in seconds (the
    first one counts, as in dae), or None after a located error."""
    params = [p.strip() for p in split_unquoted(inner, ",")]
    if not any(params):
        sink.error("invalid-annotation", path, "a filter annotation [...] needs a key: value", loc)
        return None
    offset: float | None = None
    for param in params:
        key, colon, value = param.partition(":")
        key = key.strip()
        if not colon or not key:
            sink.error("invalid-annotation", path, "a filter annotation's entries are key: value", loc)
            return None
        if key not in ANNOTATION_KEYS:
            sink.error(
                "unknown-annotation",
                path,
                f"unknown filter annotation key {key!r}; known: {', '.join(ANNOTATION_KEYS)}",
                loc,
            )
            return None
        seconds = parse_go_duration(unquote(value.strip()))
        if seconds is None:
            sink.error("invalid-value", path, "add_latency takes a duration such as -500ms", loc)
            return None
        if not offset:  # dae: "Only the first setting is valid" (the first non-zero one)
            offset = seconds
    return offset or 0.0


def parse_filter_line(text: str, path: str, loc: SourceLoc, sink: Sink) -> FilterLine:
    """One ``filter:`` line. A trailing dae annotation ``[add_latency: -500ms]`` gives the
    line's nodes a ranking latency offset (:attr:`NodeFilter.add_latency`)."""
    if not text.strip():
        sink.warning("empty-filter", path, "empty filter selects no node", loc)
        return FilterLine("filter", None)
    text, annotation = _split_annotation(text)
    add_latency = 0.0
    if annotation is not None:
        parsed = _parse_annotation(annotation, path, loc, sink)
        if parsed is None:
            return FilterLine("ignored")
        add_latency = parsed
        if not text.strip():
            sink.error("invalid-annotation", path, "a filter annotation needs a filter before it", loc)
            return FilterLine("ignored")
    calls: list[Call] = []
    try:
        for term in split_unquoted(text, "&&"):
            calls.append(parse_call(term, bare_prefixes=False))
    except ExprError:
        sink.warning("unparseable-filter", path, "filter cannot be parsed and is ignored", loc)
        return FilterLine("ignored")
    if any(c.name == "group" for c in calls):
        if len(calls) != 1 or calls[0].negated:
            sink.warning(
                "unparseable-filter", path, "group(...) must stand alone on its filter line; ignored", loc
            )
            return FilterLine("ignored")
        tags: list[str] = []
        for arg in calls[0].args or []:
            for piece in re.split(r"[,|]", unquote(arg)):
                piece = unquote(piece)
                if piece:
                    tags.append(piece)
        if annotation is not None:
            sink.error(
                "invalid-annotation",
                path,
                "a filter annotation applies to nodes; group(...) members are not annotated",
                loc,
            )
            return FilterLine("ignored")
        if not tags:
            sink.warning("empty-subgroup", path, "explicit group() adds no member", loc)
        return FilterLine("groups", groups=tuple(tags))
    terms: list[FilterTerm] = []
    for call in calls:
        if call.name not in ("name", "subtag") or call.args is None:
            sink.warning(
                "unparseable-filter", path, "only name(...) and subtag(...) filter nodes; ignored", loc
            )
            return FilterLine("ignored")
        args: list[MatchArg] = []
        for raw in call.args:
            m = re.match(r"^(keyword|regex)\s*:", raw)
            arg = MatchArg(m.group(1), unquote(raw[m.end() :])) if m else MatchArg("", unquote(raw))
            if arg.key == "regex" and not _compile(arg.value):
                sink.error("invalid-regex", path, "regular expression does not compile", loc)
                return FilterLine("ignored")
            args.append(arg)
        terms.append(FilterTerm(call.name, tuple(args), call.negated))
    return FilterLine("filter", NodeFilter(tuple(terms), add_latency))


# --- routing rules ---------------------------------------------------------------------

_BARE_MATCHERS = {
    "geosite": ("domain", "geosite"),
    "geoip": ("dip", "geoip"),
    "domain": ("domain", ""),
    "suffix": ("domain", "suffix"),
    "keyword": ("domain", "keyword"),
    "regex": ("domain", "regex"),
    "full": ("domain", "full"),
}


def parse_rule(text: str, path: str, loc: SourceLoc, sink: Sink) -> RuleSpec | None:
    """One traffic rule; problems are reported and give None.

    The outbound may be written ``x(must)``, ``must_x`` (dae's spelling of the same; the
    prefix is stripped whatever follows it, as dae does, so ``-> must_x`` names ``x`` even
    when a group is literally called ``must_x``), ``must_rules`` (the :data:`MUST_RULES`
    marker, kept as the outbound) or ``x(mark: 0x800)``: the mark is kept in
    ``RuleSpec.mark``: the direct dial's socket mark (the loader refuses it on other outbounds).
    """
    arrow = _find_arrow(text)
    if arrow < 0:
        sink.warning("missing-arrow", path, "rule has no '-> outbound'; omitted", loc)
        return None
    lhs, rhs = text[:arrow], text[arrow + 2 :]
    predicates: list[Predicate] = []
    ok = True
    for term in split_unquoted(lhs, "&&"):
        try:
            call = parse_call(term, bare_prefixes=True)
            predicates.append(_predicate(call))
        except ExprError as exc:
            sink.error(exc.code, path, exc.message, loc)
            ok = False
    try:
        outbound = parse_outbound(rhs)
    except ExprError as exc:
        sink.error(exc.code, path, exc.message, loc)
        return None
    if "->" in outbound.name:
        sink.info("legacy-arrow-target", path, "a second '->' is part of the outbound name", loc)
    elif "#" in outbound.name:
        sink.info("legacy-glued-hash", path, "a glued '#' is part of the outbound name", loc)
    if not outbound.name:
        sink.error("invalid-rule", path, "rule has no outbound after '->'", loc)
        ok = False
    if not ok:
        return None
    return RuleSpec(tuple(predicates), outbound.name, outbound.must, loc, mark=outbound.mark)


def _find_arrow(text: str) -> int:
    for i, _c in _top_level(text):
        if text.startswith("->", i):
            return i
    return -1


@dataclass(frozen=True, slots=True)
class Outbound:
    """A rule's target as read: ``name`` with ``must_`` stripped (or :data:`MUST_RULES`)."""

    name: str
    must: bool = False
    mark: int | None = None


def parse_outbound(rhs: str) -> Outbound:
    """The text after a rule's ``->``. A parenthesised tail is read as parameters only when
    every one is ``must`` or ``mark: N``; otherwise the whole text is the name, as before.
    Raises :class:`ExprError` for a mark that is not a 32-bit number."""
    target = rhs.strip()
    must, mark = False, None
    params = _outbound_params(target)
    if params is not None:
        target, items = params
        for item in items:
            if item == "must":
                must = True
                continue
            try:
                mark = parse_go_uint(unquote(item.split(":", 1)[1]), MARK_BITS)
            except ValueError:
                raise _bad("mark must be a number within 0..0xffffffff (decimal, 0x, 0o or 0b)") from None
    name = unquote(target)
    if name.startswith(MUST_PREFIX) and name != MUST_RULES:
        name, must = name[len(MUST_PREFIX) :], True
    return Outbound(name, must, mark)


_OUTBOUND_PARAM = re.compile(r"must|mark\s*:\s*\S+")


def _outbound_params(target: str) -> tuple[str, list[str]] | None:
    """``name(p, ...)`` as ``(name, [p, ...])`` when every parameter is ``must`` or ``mark: N``."""
    if not target.endswith(")"):
        return None
    mask, _ = quote_mask(target)
    open_index = next((i for i, c in enumerate(target) if c == "(" and not mask[i]), -1)
    if open_index <= 0 or matching_paren(target, open_index) != len(target) - 1:
        return None
    items = [p.strip() for p in split_unquoted(target[open_index + 1 : -1], ",")]
    if not all(_OUTBOUND_PARAM.fullmatch(p) for p in items):
        return None
    return target[:open_index].strip(), items


_GO_UINT = re.compile(r"0[xX](_?[0-9a-fA-F])+|0[oO](_?[0-7])+|0[bB](_?[01])+|0(_?[0-7])*|[1-9](_?[0-9])*")


def parse_go_uint(text: str, bits: int) -> int:
    """An unsigned number as Go's ``strconv.ParseUint(text, 0, bits)`` reads it (dae reads
    ``dscp`` and ``mark`` so): ``0x``, ``0o``, ``0b`` prefixes, a leading ``0`` for octal,
    ``_`` between digits. Raises ValueError."""
    if not _GO_UINT.fullmatch(text):
        raise ValueError(text)
    digits = text.replace("_", "")
    if len(digits) > 1 and digits[0] == "0" and digits[1].isdigit():
        value = int(digits, 8)  # Go's legacy octal: 010 is 8
    else:
        value = int(digits, 0)
    if value >= 1 << bits:
        raise ValueError(text)
    return value


def _predicate(call: Call) -> Predicate:
    if call.args is None:
        if call.name not in _BARE_MATCHERS:  # `ext:` names a file of domains or of IPs: say which
            raise ExprError(
                "unknown-traffic-predicate",
                f"'{call.name}:' is not a matcher on its own; write domain({call.name}: …) "
                f"or dip({call.name}: …)",
            )
        pred, key = _BARE_MATCHERS[call.name]
        return Predicate(pred, (_check(pred, MatchArg(key, call.value)),), call.negated)
    name = PREDICATE_ALIASES.get(call.name, call.name)
    if name not in TRAFFIC_PREDICATES:
        raise ExprError("unknown-traffic-predicate", "unknown matcher")
    args = tuple(_check(name, _routing_arg(name, a)) for a in call.args)
    return Predicate(name, args, call.negated)


def _routing_arg(pred: str, arg: str) -> MatchArg:
    m = _CONTAINS_ARG.match(arg) if pred == "domain" else None
    if m:
        return MatchArg("keyword", unquote(arg[m.end() :]))
    return split_arg(arg)


def _ext_code(value: str) -> str:
    """``ext: "file.dat:tag"``: a list of another geodata file; the tag compares case-insensitively."""
    name, sep, tag = value.strip().rpartition(":")
    if not sep or not name.strip() or not tag.strip():
        raise _bad("ext: names a file and a list, 'file.dat:tag'")
    return f"{name.strip()}:{tag.strip().lower()}"


def _bad(message: str) -> ExprError:
    return ExprError("invalid-value", message)


def _port(value: str) -> str:
    m = re.fullmatch(r"\s*(\d{1,5})\s*(?:-\s*(\d{1,5})\s*)?", value)
    if not m:
        raise _bad("port must be a number or a 'start-end' range")
    lo = int(m.group(1))
    hi = int(m.group(2)) if m.group(2) is not None else lo
    if lo > 65535 or hi > 65535 or lo > hi:
        raise _bad("port must be within 0..65535 with start <= end")
    return str(lo) if m.group(2) is None else f"{lo}-{hi}"


def _check(pred: str, arg: MatchArg) -> MatchArg:
    """Validate one argument for its predicate and return it normalised."""
    key, value = arg.key, arg.value
    if pred == "domain":
        if key == "domain":
            key = ""
        if key not in ("", "suffix", "full", "keyword", "regex", "geosite", "ext"):
            raise _bad("domain(...) accepts suffix:, full:, keyword:, regex:, geosite: or ext: arguments")
        if not value:
            raise _bad("empty domain argument")
        if key == "regex":
            if not _compile(value):
                raise ExprError("invalid-regex", "regular expression does not compile")
            return MatchArg(key, value)
        if key == "ext":
            return MatchArg(key, _ext_code(value))
        return MatchArg(key, value.lower().rstrip(".") if key != "geosite" else value.lower())
    if pred in ("dip", "sip"):
        if key == "geoip":
            if not value:
                raise _bad("empty geoip code")
            return MatchArg("geoip", value.lower())
        if key == "ext":
            return MatchArg(key, _ext_code(value))
        if key:
            raise _bad("an IP matcher accepts addresses, CIDRs, geoip: or ext: codes")
        try:
            if "/" in value:
                return MatchArg("", str(ipaddress.ip_network(value.strip(), strict=False)))
            return MatchArg("", str(ipaddress.ip_address(value.strip())))
        except ValueError:
            raise _bad("not an IP address or CIDR") from None
    if key:
        raise _bad("this matcher takes no prefixed arguments")
    if pred in ("dport", "sport"):
        return MatchArg("", _port(value))
    if pred == "l4proto":
        v = value.strip().lower()
        if v not in ("tcp", "udp"):
            raise _bad("l4proto accepts tcp or udp")
        return MatchArg("", v)
    if pred == "ipversion":
        v = value.strip().lower()
        if v not in ("4", "6", "ipv4", "ipv6"):
            raise _bad("ipversion accepts 4, 6, ipv4 or ipv6")
        return MatchArg("", v[-1])
    if pred == "mac":
        parts = re.split(r"[:-]", value.strip())
        if len(parts) != 6 or not all(re.fullmatch(r"[0-9A-Fa-f]{1,2}", p) for p in parts):
            raise _bad("not a MAC address")
        return MatchArg("", ":".join(p.lower().zfill(2) for p in parts))
    if pred == "dscp":
        try:
            number = parse_go_uint(value.strip(), DSCP_BITS)
        except ValueError:
            number = -1
        if not 0 <= number <= DSCP_MAX:
            raise _bad("dscp accepts 0..63 (decimal, 0x, 0o or 0b)")
        return MatchArg("", str(number))
    # pname: any non-empty process name
    if not value:
        raise _bad("empty argument")
    return MatchArg("", value)
