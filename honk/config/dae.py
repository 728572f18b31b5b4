"""The dae dialect reader: lexer, block parser, and conversion to a :class:`Doc`.

Reading happens in two steps.

1. :func:`parse_blocks` turns the text into a tree of :class:`Block` and
   :class:`Stmt` objects with physical line numbers. It applies the lexical
   rules of honk's dialect reference: ``#`` starts a comment only at token head
   (start of the statement or after a space or tab) outside quotes, so a glued
   ``#`` is data; quotes are single or double and must close on their physical
   line (``unterminated-quote``); a structural ``{`` ends its line (or is
   followed by a space or ``}``) and may be glued to its header as dae allows
   (``block-delimiter-spacing``, an info); braces inside quotes or inside
   parentheses are data; an extra ``}`` is ignored (``unmatched-close``); an
   unclosed block rejects the document (``unclosed-block``). Routing rules and
   group ``filter:`` lines continue over lines as dae joins them (see
   :func:`parse_blocks`).

2. :func:`to_doc` interprets the known sections (``global``, ``inbound``,
   ``node``, ``subscription``, ``group``, ``routing``, ``dns``, ``include``,
   ``experimental``) and flattens them into :class:`~honk.config.tree.Entry`
   lists with key paths. Setting values stay as written (``raw=True``); the
   builder reads them with :mod:`honk.config.values`. Subscription entries
   (``tag: 'url'(UA)``, bare URLs, ``tag: {`` blocks) are split here into
   :class:`~honk.config.tree.SubscriptionDecl` objects.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from honk.config.assets import dae_entries as assets_entries
from honk.config.diagnostics import SourceLoc
from honk.config.expr import matching_paren
from honk.config.tree import Doc, Entry, GroupDecl, Sink, SubscriptionDecl, join_path
from honk.config.values import QUOTE_OPENERS, QUOTES, unquote


@dataclass(slots=True)
class Stmt:
    text: str
    line: int


@dataclass(slots=True)
class Block:
    header: str
    line: int
    items: list[Stmt | Block] = field(default_factory=list)


# --- lexing ----------------------------------------------------------------------


@dataclass(slots=True)
class _Line:
    """One physical line cut into text pieces and structural braces."""

    tokens: list[tuple[str, str]]  # ("text", s) | ("open", header-glued?) | ("close", "")
    depth: int  # unquoted parenthesis depth at the end of the line


def _scan_line(line: str, lineno: int, depth: int, file: str, sink: Sink) -> _Line:
    tokens: list[tuple[str, str]] = []
    buf: list[str] = []
    n = len(line)
    i = 0
    prev_closed = False
    while i < n:
        c = line[i]
        prev = line[i - 1] if i > 0 else ""
        # comment: token-head '#' outside quotes
        if c == "#" and (prev in (" ", "\t") or not "".join(buf).strip()):
            break
        if c in QUOTES and (i == 0 or prev in QUOTE_OPENERS or prev_closed):
            j = i + 1
            while j < n and line[j] != c:
                j += 2 if line[j] == "\\" else 1
            if j >= n:
                sink.error(
                    "unterminated-quote",
                    "document",
                    "a quote does not close on its line",
                    SourceLoc(file, lineno),
                )
                buf.append(line[i:] + c)  # close it for recovery
                i = n
                break
            buf.append(line[i : j + 1])
            i = j + 1
            prev_closed = True
            continue
        prev_closed = False
        if c == "(":
            depth += 1
        elif c == ")":
            if depth > 0:
                depth -= 1
        elif c == "{" and depth == 0:
            nxt = line[i + 1] if i + 1 < n else ""
            if nxt in ("", " ", "\t", "\r", "}"):
                text = "".join(buf)
                glued = bool(text.strip()) and prev not in (" ", "\t")
                if glued:  # dae's grammar reads 'global{' as 'global {'
                    sink.info(
                        "block-delimiter-spacing",
                        "document",
                        "'{' glued to the block name opens the block",
                        SourceLoc(file, lineno),
                    )
                tokens.append(("text", text))
                tokens.append(("open", ""))
                buf = []
                i += 1
                continue
        elif c == "}" and depth == 0 and (i == 0 or prev in (" ", "\t", "{", "}")):
            tokens.append(("text", "".join(buf)))
            tokens.append(("close", ""))
            buf = []
            i += 1
            continue
        buf.append(c)
        i += 1
    tokens.append(("text", "".join(buf)))
    return _Line(tokens, depth)


_FILTER_KEY = re.compile(r"^filter\s*:")
_ROUTING_JOINERS = ("&&", "->")  # a routing rule goes on after (or before) either
_FILTER_JOINERS = ("&&",)


_DNS_RULE_BLOCKS = ("dns", "routing")  # dns { routing { request|response { rules } } }
_DNS_RULE_PHASES = ("request", "response")


def _continuation(stack: list[Block]) -> str | None:
    """Where statements may continue over lines: the root ``routing`` block, the ``request``
    and ``response`` blocks of ``dns { routing { } }`` (dae's grammar is the same for both),
    or a group's block (only its ``filter:`` statements)."""
    headers = tuple(b.header.strip() for b in stack[1:])
    dns_rules = len(headers) == 3 and headers[:2] == _DNS_RULE_BLOCKS and headers[2] in _DNS_RULE_PHASES
    if headers == ("routing",) or dns_rules:
        return "routing"
    if len(stack) == 3 and stack[1].header.strip() == "group":
        return "filter"
    return None


def _joiners(context: str | None, text: str) -> tuple[str, ...]:
    if context == "routing" and not _FALLBACK.match(text):
        return _ROUTING_JOINERS
    if context == "filter" and _FILTER_KEY.match(text):
        return _FILTER_JOINERS
    return ()


def parse_blocks(text: str, file: str, sink: Sink) -> Block:
    """Lex and parse a dae document into a block tree (the root has header '').

    dae's grammar skips newlines, so a statement may continue over lines, and these do
    (nothing else is joined): in the root ``routing`` block (and in ``dns``'s ``request`` and
    ``response`` blocks) a rule whose parentheses are
    open at the end of a line, whose text ends with ``&&`` or ``->``, or that the next
    non-blank, non-comment line continues by starting with ``&&`` or ``->``; in a group's
    block a ``filter:`` that ends with ``&&`` or that the next such line continues by
    starting with ``&&``. A joined statement keeps its first line; one still incomplete
    when its block ends is an error (``unterminated-matcher``, ``unterminated-statement``).
    """
    root = Block("", 0)
    stack: list[Block] = [root]
    pending: Stmt | None = None  # a statement continued across lines
    joiners: tuple[str, ...] = ()  # what ends or starts a continuation of ``pending``
    depth = 0  # unquoted parenthesis depth at the end of ``pending`` (routing only)
    for lineno, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if pending is not None and line.lstrip().startswith("}"):
            _unterminated(pending, depth, " before the block ends", file, sink)
            stack[-1].items.append(pending)
            pending, depth = None, 0
        scanned = _scan_line(line, lineno, depth if pending is not None else 0, file, sink)
        toks = scanned.tokens
        for k, (kind, value) in enumerate(toks):
            if kind == "text":
                is_header = k + 1 < len(toks) and toks[k + 1][0] == "open"
                if pending is not None:
                    pending.text += "\n" + value
                    if is_header:  # a brace after a continued statement: finish it first
                        stack[-1].items.append(pending)
                        pending = None
                    continue
                if is_header:
                    continue  # consumed by the "open" token
                stripped = value.strip()
                if not stripped:
                    continue
                last = k == len(toks) - 1
                context = _continuation(stack)  # a block may have opened earlier on this line
                items = stack[-1].items
                prev = items[-1] if k == 0 and items and isinstance(items[-1], Stmt) else None
                prev_joiners = _joiners(context, prev.text) if prev is not None else ()
                if prev_joiners and stripped.startswith(prev_joiners):
                    # a line that starts with '&&' (or '->') continues the statement before it
                    items.pop()
                    prev.text += "\n" + stripped
                    stmt = prev
                else:
                    stmt = Stmt(stripped, lineno)
                if last and _joiners(context, stmt.text):
                    pending, joiners = stmt, _joiners(context, stmt.text)
                    continue
                items.append(stmt)
            elif kind == "open":
                header = toks[k - 1][1].strip() if k > 0 and toks[k - 1][0] == "text" else ""
                if pending is not None:
                    header = ""
                if not header:
                    sink.error(
                        "missing-block-header",
                        "document",
                        "a block opens without a name on its line",
                        SourceLoc(file, lineno),
                    )
                block = Block(header, lineno)
                stack[-1].items.append(block)
                stack.append(block)
            else:  # close
                if pending is not None:
                    stack[-1].items.append(pending)
                    pending = None
                if len(stack) > 1:
                    stack.pop()
                else:
                    sink.warning(
                        "unmatched-close", "document", "an extra '}' is ignored", SourceLoc(file, lineno)
                    )
        if pending is not None:
            # only a routing rule continues while its parentheses are open
            depth = scanned.depth if joiners == _ROUTING_JOINERS else 0
            if depth == 0 and not pending.text.rstrip().endswith(joiners):
                stack[-1].items.append(pending)
                pending = None
    if pending is not None:
        _unterminated(pending, depth, "", file, sink)
        stack[-1].items.append(pending)
    for idx, block in enumerate(stack[1:], start=1):
        sink.error(
            "unclosed-block",
            join_path(*[b.header for b in stack[1 : idx + 1]]) or "document",
            "block is not closed with '}'",
            SourceLoc(file, block.line),
        )
    return root


def _unterminated(stmt: Stmt, depth: int, where: str, file: str, sink: Sink) -> None:
    """``stmt`` still continues where its block (or the document) ends."""
    if depth > 0:
        code, message = "unterminated-matcher", "a matcher's argument list is not closed" + where
    else:
        code, message = (
            "unterminated-statement",
            "a statement continued by '&&' or '->' is not finished" + where,
        )
    sink.error(code, "document", message, SourceLoc(file, stmt.line))


# --- interpretation ----------------------------------------------------------------

ROOT_SECTIONS = (
    "global",
    "inbound",
    "node",
    "subscription",
    "group",
    "routing",
    "dns",
    "include",
    "experimental",
    "assets",
)


def _loc(file: str, line: int) -> SourceLoc:
    return SourceLoc(file, line)


def _key_value(stmt: Stmt) -> tuple[str, str] | None:
    colon = stmt.text.find(":")
    if colon <= 0:
        return None
    key = stmt.text[:colon].strip()
    if not key or any(ch in key for ch in " \t'\"(){}"):
        return None
    return key, stmt.text[colon + 1 :].strip()


def _skip_unknown_block(block: Block, prefix: str, file: str, sink: Sink) -> None:
    """A nested block where only settings or entries belong: warn once and skip it whole."""
    sink.warning(
        "unknown-block",
        join_path(prefix, block.header),
        "unknown nested block is skipped",
        _loc(file, block.line),
    )


def _settings(block: Block, prefix: str, file: str, sink: Sink) -> list[Entry]:
    """``key: value`` statements; nested blocks are skipped with ``unknown-block``."""
    out: list[Entry] = []
    for item in block.items:
        if isinstance(item, Block):
            _skip_unknown_block(item, prefix, file, sink)
            continue
        if item.text.startswith("/*"):
            sink.warning(
                "unsupported-comment", prefix, "'/* */' comments are not supported", _loc(file, item.line)
            )
            continue
        kv = _key_value(item)
        if kv is None:
            sink.warning(
                "invalid-statement", prefix, "expected 'key: value'; statement ignored", _loc(file, item.line)
            )
            continue
        key, value = kv
        out.append(Entry(key, value, join_path(prefix, key), _loc(file, item.line), raw=True))
    return out


_BARE_TAG = re.compile(r"^([^:'\"\s]*)(\s*):")


def split_entry(text: str, path: str, loc: SourceLoc, sink: Sink) -> tuple[str | None, str] | None:
    """A ``node``/``inbound`` entry: ``[tag:] link``, either part bare or quoted.

    Returns ``(tag or None, link)`` or None when the entry is skipped.
    """
    s = text.strip()
    tag: str | None = None
    if s and s[0] in QUOTES:
        end = _close_quote(s)
        if end < 0:
            return None  # already reported by the lexer
        head = s[1:end]
        rest = s[end + 1 :]
        if rest.startswith(":"):
            tag = head
            s = rest[1:].strip()
        else:
            return None if not _tail_ok(rest, path, loc, sink) else (None, head)
    elif (bare := _bare_tag(s, path, loc, sink)) is not None:
        tag, s = bare
    if s and s[0] in QUOTES:
        end = _close_quote(s)
        if end < 0:
            return None
        if not _tail_ok(s[end + 1 :], path, loc, sink):
            return None
        link = s[1:end]
    else:
        link = s
    return (tag or None), link


def _bare_tag(s: str, path: str, loc: SourceLoc, sink: Sink) -> tuple[str, str] | None:
    """``tag: rest`` with an unquoted tag as ``(tag, rest)``; None when there is none (the
    colon of a URL's ``scheme://`` is no tag colon)."""
    m = _BARE_TAG.match(s)
    if not m or s[m.end() :].startswith("//"):
        return None
    if m.group(2):
        sink.info("entry-tag-normalized", path, "whitespace before the tag colon is ignored", loc)
    return m.group(1), s[m.end() :].strip()


def _close_quote(s: str) -> int:
    q = s[0]
    j = 1
    while j < len(s) and s[j] != q:
        j += 2 if s[j] == "\\" else 1
    return j if j < len(s) else -1


def _tail_ok(tail: str, path: str, loc: SourceLoc, sink: Sink) -> bool:
    tail = tail.strip()
    if not tail:
        return True
    if tail.startswith("#"):
        sink.info("legacy-glued-hash", path, "a '#' glued to a closing quote is read as a comment", loc)
        return True
    sink.warning("trailing-entry-text", path, "text after the quoted entry; entry skipped", loc)
    return False


def _entries(block: Block, section: str, file: str, sink: Sink) -> list[Entry]:
    """Tagged or untagged entries (``node``, ``inbound``)."""
    out: list[Entry] = []
    index = 0
    for item in block.items:
        if isinstance(item, Block):
            _skip_unknown_block(item, section, file, sink)
            continue
        path = join_path(section, index)
        loc = _loc(file, item.line)
        index += 1
        parsed = split_entry(item.text, path, loc, sink)
        if parsed is None:
            continue
        tag, link = parsed
        out.append(Entry(tag, link, join_path(section, tag) if tag else path, loc))
    return out


def _include_paths(block: Block, file: str, sink: Sink, start: int) -> list[Entry]:
    out: list[Entry] = []
    for item in block.items:
        if isinstance(item, Block):
            _skip_unknown_block(item, "include", file, sink)
            continue
        for token in _path_tokens(item.text):
            idx = start + len(out)
            out.append(Entry(None, token, join_path("include", idx), _loc(file, item.line)))
    return out


def _path_tokens(text: str) -> list[str]:
    """Whitespace-separated include paths; quoted paths keep spaces and hashes."""
    tokens: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in " \t":
            i += 1
            continue
        if c in QUOTES:
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            tokens.append(text[i + 1 : j])
            i = j + 1
            continue
        j = i
        while j < n and text[j] not in " \t":
            j += 1
        tokens.append(text[i:j])
        i = j
    return [t for t in tokens if t]


_FALLBACK = re.compile(r"^(fallback|default)\s*:")


def to_doc(root: Block, file: str, sink: Sink) -> Doc:
    doc = Doc(file=file, fmt="dae")
    for item in root.items:
        if isinstance(item, Stmt):
            if item.text.startswith("/*"):
                sink.warning(
                    "unsupported-comment",
                    "document",
                    "'/* */' comments are not supported",
                    _loc(file, item.line),
                )
            else:
                sink.warning(
                    "unknown-statement",
                    "document",
                    "statement outside any section is ignored",
                    _loc(file, item.line),
                )
            continue
        name = item.header
        loc = _loc(file, item.line)
        if name == "global":
            doc.global_.extend(_settings(item, "global", file, sink))
        elif name == "inbound":
            doc.inbounds.extend(_entries(item, "inbound", file, sink))
        elif name == "node":
            doc.nodes.extend(_entries(item, "node", file, sink))
        elif name == "subscription":
            _subscriptions(item, file, sink, doc)
        elif name == "dns":
            doc.dns = (doc.dns or []) + _dns(item, file, sink)
        elif name == "group":
            _groups(item, file, sink, doc)
        elif name == "routing":
            _routing(item, file, sink, doc)
        elif name == "include":
            doc.includes.extend(_include_paths(item, file, sink, len(doc.includes)))
        elif name == "experimental":
            _experimental(item, file, sink, doc)
        elif name == "assets":
            doc.assets.extend(assets_entries(item, file, sink))
        elif name:
            sink.warning("unknown-section", name, "unknown section is skipped", loc)
    return doc


# --- subscriptions ---------------------------------------------------------------------

_SKIP = object()  # an entry tail that makes the whole entry be skipped (already reported)


def _subscriptions(block: Block, file: str, sink: Sink, doc: Doc) -> None:
    """``subscription`` entries, inline or block form (upstream subscription reference).

    Untagged entries get the key path ``subscription[N]``, where ``N`` counts
    every entry of the block in source order, skipped ones and blocks included.
    """
    for ordinal, item in enumerate(block.items):
        loc = _loc(file, item.line)
        if isinstance(item, Block):
            tag = _block_tag(item.header)
            path = join_path("subscription", tag) if tag else join_path("subscription", ordinal)
            doc.subscriptions.append(SubscriptionDecl(tag, path, loc, _settings(item, path, file, sink)))
            continue
        path = join_path("subscription", ordinal)
        if item.text.startswith("/*"):
            sink.warning("unsupported-comment", path, "'/* */' comments are not supported", loc)
            continue
        parsed = split_subscription_entry(item.text, path, loc, sink)
        if parsed is None:
            continue
        tag, url, user_agent = parsed
        if tag is None and "://" not in url:
            sink.warning("invalid-statement", path, "expected '[tag:] url'; statement ignored", loc)
            continue
        if tag:
            path = join_path("subscription", tag)
        entries = [Entry("url", url, path, loc)]
        if user_agent is not None:
            entries.append(Entry("ua", user_agent, path, loc))
        doc.subscriptions.append(SubscriptionDecl(tag, path, loc, entries))


def _block_tag(header: str) -> str:
    """``paid:`` (or ``'paid':``, or ``paid``) as the tag of a block-form subscription."""
    h = header.strip()
    if h.endswith(":"):
        h = h[:-1]
    return unquote(h)


def split_subscription_entry(
    text: str, path: str, loc: SourceLoc, sink: Sink
) -> tuple[str | None, str, str | None] | None:
    """An inline subscription: ``[tag:] url`` where a quoted URL may carry a ``(UA)`` suffix.

    Returns ``(tag, url, user_agent)``; the tag is None when there is none, ''
    when it is explicitly empty (validation rejects that). None: the entry is
    skipped (reported here or by the lexer).
    """
    s = text.strip()
    tag: str | None = None
    if s and s[0] in QUOTES:
        end = _close_quote(s)
        if end < 0:
            return None  # already reported by the lexer
        head, rest = s[1:end], s[end + 1 :]
        after = rest.lstrip()
        if not after.startswith(":"):
            # A quoted URL without an explicit tag; a tag may sit inside the quotes.
            user_agent = _url_suffix(rest, path, loc, sink)
            if user_agent is _SKIP:
                return None
            tag, url = _embedded_tag(head)
            return tag, url, user_agent  # type: ignore[return-value]
        tag = head
        value = after[1:].strip()
    else:
        bare = _bare_tag(s, path, loc, sink)
        if bare is None:
            return None, s, None  # a bare URL; parentheses in it are data
        tag, value = bare
    if value and value[0] in QUOTES:
        end = _close_quote(value)
        if end < 0:
            return None
        user_agent = _url_suffix(value[end + 1 :], path, loc, sink)
        if user_agent is _SKIP:
            return None
        return tag, value[1:end], user_agent  # type: ignore[return-value]
    return tag, value, None


def _embedded_tag(text: str) -> tuple[str | None, str]:
    """``paid:https://...`` -> ``("paid", "https://...")``; a colon that starts ``://`` is no tag."""
    colon = text.find(":")
    if colon > 0 and not text.startswith("//", colon + 1):
        return text[:colon].strip(), text[colon + 1 :].strip()
    return None, text


def _url_suffix(tail: str, path: str, loc: SourceLoc, sink: Sink) -> str | None | object:
    """What follows a quoted subscription URL: nothing, ``(UA)``, or a glued ``#`` comment.

    Returns the User-Agent (None when absent or empty), or ``_SKIP``.
    """
    t = tail.strip()
    if not t:
        return None
    if t.startswith("#"):
        sink.info("legacy-glued-hash", path, "put whitespace before a comment", loc)
        return None
    if not t.startswith("("):
        sink.warning("trailing-entry-text", path, "text after the quoted URL; entry skipped", loc)
        return _SKIP
    close = matching_paren(t, 0)
    if close < 0:
        sink.warning("trailing-entry-text", path, "the User-Agent suffix is not closed; entry skipped", loc)
        return _SKIP
    after = t[close + 1 :]
    if after.startswith("#"):
        sink.info("legacy-glued-hash", path, "put whitespace before a comment", loc)
    elif after.strip():
        sink.warning("legacy-ua-boundary", path, "text after the User-Agent suffix; entry skipped", loc)
        return _SKIP
    return unquote(t[1:close]) or None


# --- groups ------------------------------------------------------------------------------


def _groups(block: Block, file: str, sink: Sink, doc: Doc) -> None:
    for item in block.items:
        if isinstance(item, Stmt):
            sink.warning(
                "invalid-statement",
                "group",
                "expected a named group block; statement ignored",
                _loc(file, item.line),
            )
            continue
        if not item.header:
            continue
        name = unquote(item.header.strip())  # a quoted name may hold spaces: 'My Proxy' { … }
        path = join_path("group", name)
        entries = _settings(item, path, file, sink)
        index = 0
        for entry in entries:
            if entry.key == "filter":
                entry.path = join_path(path, "filter", index)
                index += 1
        doc.groups.append(GroupDecl(name, path, _loc(file, item.line), entries))


def _routing(block: Block, file: str, sink: Sink, doc: Doc) -> None:
    index = len(doc.rules)
    for item in block.items:
        if isinstance(item, Block):
            _skip_unknown_block(item, "routing", file, sink)
            continue
        loc = _loc(file, item.line)
        if item.text.startswith("/*"):
            sink.warning("unsupported-comment", "routing", "'/* */' comments are not supported", loc)
            continue
        m = _FALLBACK.match(item.text)
        if m:
            doc.fallbacks.append(
                Entry("fallback", item.text[m.end() :].strip(), "routing.fallback", loc, raw=True)
            )
            continue
        doc.rules.append(Entry(None, item.text, join_path("routing", "rules", index), loc))
        index += 1


_DNS_FALLBACK = re.compile(r"^fallback\s*:")


def _dns(block: Block, file: str, sink: Sink) -> list[Entry]:
    """The ``dns`` section as entries (the key scheme is described on ``Doc.dns``)."""
    out = [Entry(None, None, "dns", _loc(file, block.line))]
    for item in block.items:
        if isinstance(item, Stmt):
            out.extend(_settings(Block("dns", block.line, [item]), "dns", file, sink))
        elif item.header == "upstream":
            path = join_path("dns", "upstream")
            out.append(Entry("upstream", None, path, _loc(file, item.line)))
            for e in _settings(item, path, file, sink):
                out.append(Entry(f"upstream.{e.key}", e.value, e.path, e.loc, raw=True))
        elif item.header == "fixed_domain_ttl":
            path = join_path("dns", "fixed_domain_ttl")
            for e in _settings(item, path, file, sink):
                out.append(Entry(f"fixed_domain_ttl.{e.key}", e.value, e.path, e.loc, raw=True))
        elif item.header == "routing":
            out.extend(_dns_routing(item, file, sink))
        else:
            _skip_unknown_block(item, "dns", file, sink)
    return out


def _dns_routing(block: Block, file: str, sink: Sink) -> list[Entry]:
    out: list[Entry] = []
    for item in block.items:
        if isinstance(item, Stmt) or item.header not in ("request", "response"):
            if isinstance(item, Block):
                _skip_unknown_block(item, "dns.routing", file, sink)
            else:
                sink.warning(
                    "invalid-statement",
                    "dns.routing",
                    "expected a request or response block; statement ignored",
                    _loc(file, item.line),
                )
            continue
        phase = item.header
        index = 0
        for rule in item.items:
            loc = _loc(file, rule.line)
            if isinstance(rule, Block):
                _skip_unknown_block(rule, join_path("dns", "routing", phase), file, sink)
                continue
            m = _DNS_FALLBACK.match(rule.text)
            if m:
                out.append(
                    Entry(
                        f"{phase}.fallback",
                        rule.text[m.end() :].strip(),
                        join_path("dns", "routing", phase, "fallback"),
                        loc,
                        raw=True,
                    )
                )
                continue
            out.append(Entry(phase, rule.text, join_path("dns", "routing", phase, index), loc))
            index += 1
    return out


def _experimental(block: Block, file: str, sink: Sink, doc: Doc) -> None:
    for item in block.items:
        loc = _loc(file, item.line)
        if isinstance(item, Stmt):
            kv = _key_value(item)
            key = kv[0] if kv else ""
            sink.error(
                "unknown-key",
                join_path("experimental", key) if key else "experimental",
                "experimental holds only the clash_api and cache_file blocks",
                loc,
            )
            continue
        path = join_path("experimental", item.header)
        if item.header == "clash_api":
            doc.clash_api = (doc.clash_api or []) + _settings(item, path, file, sink)
        elif item.header == "cache_file":
            doc.cache_file = (doc.cache_file or []) + _settings(item, path, file, sink)
        else:
            sink.error("unknown-block", path, "experimental holds only clash_api and cache_file", loc)


def read(text: str, file: str, sink: Sink) -> tuple[Doc, bool]:
    """Read a dae document. Returns the doc and whether it declared any block."""
    root = parse_blocks(text, file, sink)
    has_block = any(isinstance(i, Block) for i in root.items)
    return to_doc(root, file, sink), has_block
