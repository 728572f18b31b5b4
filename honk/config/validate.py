"""Cross-reference checks over the built parts, after includes are merged.

* nodes: a user node may not be called ``direct`` or ``block``
  (``reserved-name``); two nodes with the same derived id are one endpoint
  declared twice (``duplicate-node``); equal names are allowed but warned
  (``duplicate-name``: the first declared wins lookups).
* inbounds: names and listen addresses are unique.
* groups: at most ``MAX_TOP_LEVEL_GROUPS``; unique names that collide with no
  node or builtin; ``final`` names an outbound; ``default`` names a member;
  nested tags name groups (``unknown-subgroup`` warning otherwise).
* routing: every target and the fallback name an outbound (the caller leaves out rules
  targeting dae's ``must_rules`` marker, which names none).
* subscriptions: a non-empty name (tagless dae entries take the URL host) and
  an ``http``/``https`` URL with a host (``invalid-subscription-url``), or dae's
  ``file://path`` (relative to the configuration's directory; named after the
  file), ``https-file://`` and ``http-file://`` (read as https/http); a
  second declaration of the same URL and User-Agent is dropped
  (``duplicate-subscription``). Equal names are fine: ``subtag(name)`` then
  selects the nodes of both.

Subscription nodes are not known while a file is checked, so a group that may
take them (it has node filter lines, or none at all) is not faulted for a
``default`` that names no configured node.
"""

from __future__ import annotations

import os
import re
from urllib.parse import urlsplit

from honk.config import values as V
from honk.config.build import GroupParts
from honk.config.spec import (
    BUILTIN_OUTBOUNDS,
    DEFAULT_SUBSCRIPTION_INTERVAL,
    MAX_TOP_LEVEL_GROUPS,
    GroupSpec,
    InboundSpec,
    NodeFilter,
    NodeSpec,
    SubscriptionSpec,
)
from honk.config.tree import Entry, Sink, SubscriptionDecl

FILE_SCHEME = "file://"  # a local node list, read at each refresh (honk.subscription.fetch.read_local)

SUBSCRIPTION_SCHEMES = ("http", "https")


def check_nodes(nodes: list[tuple[NodeSpec, Entry]], sink: Sink) -> list[NodeSpec]:
    kept: list[NodeSpec] = []
    ids: set = set()
    names: set[str] = set()
    for node, e in nodes:
        if node.name in BUILTIN_OUTBOUNDS:
            sink.error("reserved-name", e.path, "'direct' and 'block' are built in; rename the node", e.loc)
            continue
        if node.id in ids:
            sink.error(
                "duplicate-node",
                e.path,
                "another node has the same endpoint, credentials and dial shape",
                e.loc,
            )
            continue
        if node.name in names:
            sink.warning(
                "duplicate-name", e.path, "another node has this name; lookups use the first declared", e.loc
            )
        ids.add(node.id)
        names.add(node.name)
        kept.append(node)
    return kept


RESERVED_INBOUND = "api"  # the Clash API listener's tag (its reload identity)
TPROXY_INBOUND = "tproxy"  # the transparent listener's tag, made by global.lan_interface/wan_interface
DNS_INBOUND = "dns"  # the DNS listener's tag, made by dns.bind


def check_inbounds(inbounds: list[InboundSpec], sink: Sink) -> None:
    names: set[str] = set()
    listens: set[tuple[str, int]] = set()
    for inbound in inbounds:
        path = f"inbound.{inbound.name}"
        if inbound.name in names:
            sink.error("duplicate-inbound", path, "another inbound has this name", inbound.loc)
        if inbound.name == RESERVED_INBOUND:
            sink.error("reserved-name", path, "the inbound name api is the Clash API listener's", inbound.loc)
        if inbound.name == TPROXY_INBOUND:
            sink.error(
                "reserved-name",
                path,
                "the inbound name tproxy is the transparent listener's "
                "(global.lan_interface, global.wan_interface)",
                inbound.loc,
            )
        if inbound.name == DNS_INBOUND:
            sink.error(
                "reserved-name", path, "the inbound name dns is the DNS listener's (dns.bind)", inbound.loc
            )
        if inbound.port and (inbound.host, inbound.port) in listens:
            sink.error("duplicate-listen", path, "another inbound listens on the same address", inbound.loc)
        names.add(inbound.name)
        listens.add((inbound.host, inbound.port))


def check_subscriptions(
    decls: list[SubscriptionDecl], sink: Sink, base_dir: str = "."
) -> list[SubscriptionSpec]:
    """``base_dir``: the configuration's directory, against which a relative ``file://`` path
    resolves (as dae resolves it against its configuration's)."""
    kept: list[SubscriptionSpec] = []
    identities: set[tuple[str, str]] = set()
    for decl in decls:
        spec = _build_subscription(decl, sink, base_dir)
        if spec is None:
            continue
        if spec.fetch_identity in identities:
            sink.warning(
                "duplicate-subscription",
                decl.path,
                "another subscription has the same URL and User-Agent; this one is ignored",
                decl.loc,
            )
            continue
        identities.add(spec.fetch_identity)
        kept.append(spec)
    return kept


def _build_subscription(decl: SubscriptionDecl, sink: Sink, base_dir: str = ".") -> SubscriptionSpec | None:
    url: str | None = None
    url_entry: Entry | None = None
    values: dict[str, object] = {}
    ok = True
    for e in decl.entries:
        key = e.key or ""
        if key == "url":
            url, url_entry = V.get_str(e, sink), e
            ok = ok and url is not None
        elif key == "ua":
            ua = V.get_str(e, sink)
            ok = ok and ua is not None
            values["user_agent"] = ua or None  # an empty override means the default
        elif key == "interval":
            seconds = V.get_seconds(e, sink)  # unparseable text is 0 (refresh off), with a warning
            ok = ok and seconds is not None
            values["interval"] = seconds
        elif key == "cache":
            flag = V.get_bool(e, sink)
            ok = ok and flag is not None
            values["cache"] = flag
        elif key == "detour":
            via = V.get_str(e, sink)
            ok = ok and via is not None
            values["detour"] = via or None  # empty: direct
        else:
            _unknown(sink, e)
    if url_entry is None:
        sink.error("missing-value", decl.path, "a subscription needs a url", decl.loc)
        return None
    if not ok or url is None:
        return None
    url, host = _dae_subscription_url(url, base_dir)
    if host is None:
        sink.error(
            "invalid-subscription-url",
            url_entry.path,
            "a subscription URL must be http:// or https:// with a host, or file://path",
            url_entry.loc,
        )
        return None
    name = decl.name if decl.name is not None or decl.structured else host
    if not name:
        sink.error("invalid-value", decl.path, "a subscription needs a non-empty name", decl.loc)
        return None
    return SubscriptionSpec(
        name=name,
        url=url,
        user_agent=values.get("user_agent"),  # type: ignore[arg-type]
        interval=values.get("interval", DEFAULT_SUBSCRIPTION_INTERVAL),  # type: ignore[arg-type]
        cache=values.get("cache", True),  # type: ignore[arg-type]
        detour=values.get("detour"),  # type: ignore[arg-type]
        loc=decl.loc,
    )


def _dae_subscription_url(url: str, base_dir: str) -> tuple[str, str | None]:
    """dae's other subscription schemes as honk reads them, with the name a tagless entry
    takes: ``file://path`` a local node list (relative to the configuration's directory),
    named after the file; ``https-file://`` and ``http-file://`` (dae keeps the last download
    in a file for offline starts) the same URL over https/http, whose last accepted body
    honk keeps in its state store anyway. Anything else is an http(s) URL or None."""
    scheme, sep, rest = url.partition("://")
    scheme = scheme.lower()
    if sep and scheme == "file" and rest.strip():
        path = os.path.normpath(os.path.join(base_dir, os.path.expanduser(rest.strip())))
        return FILE_SCHEME + path, os.path.basename(path) or None
    if sep and scheme in ("https-file", "http-file"):
        url = f"{scheme[: -len('-file')]}://{rest}"
    return url, _http_url_host(url)


def _http_url_host(url: str) -> str | None:
    """The host of an ``http``/``https`` URL (unbracketed, lower case), or None if it is not one."""
    if any(c.isspace() or ord(c) < 0x20 for c in url):
        return None
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        return None
    if parts.scheme.lower() not in SUBSCRIPTION_SCHEMES or not parts.hostname:
        return None
    return parts.hostname


def _unknown(sink: Sink, e: Entry) -> None:
    sink.warning("unknown-key", e.path, "unknown key is ignored", e.loc)


def check_groups(
    parts: list[GroupParts], nodes: list[NodeSpec], sink: Sink, *, subscriptions: bool = False
) -> list[GroupSpec]:
    node_names = {n.name for n in nodes}
    if len(parts) > MAX_TOP_LEVEL_GROUPS:
        extra = parts[MAX_TOP_LEVEL_GROUPS]
        sink.error(
            "too-many-groups",
            extra.decl.path,
            f"at most {MAX_TOP_LEVEL_GROUPS} groups are allowed",
            extra.decl.loc,
        )
    seen: set[str] = set()
    kept: list[GroupParts] = []
    for p in parts:
        name = p.spec.name
        if not name:
            sink.error("invalid-value", p.decl.path, "a group needs a name", p.decl.loc)
            continue
        if name in seen:
            sink.error("duplicate-group", p.decl.path, "another group has this name", p.decl.loc)
            continue
        # A group may share a node's name (upstream honk's own config.dae does: node and group
        # `iris`); the group then answers to that name (routing, final, default, the API) and
        # name(...) filters still select the node. Only the builtins stay reserved.
        if name in BUILTIN_OUTBOUNDS:
            sink.error(
                "name-collision",
                p.decl.path,
                "group name is already used by a builtin outbound",
                p.decl.loc,
            )
            continue
        seen.add(name)
        kept.append(p)
    outbounds = set(BUILTIN_OUTBOUNDS) | node_names | seen
    for p in kept:
        for tag, e in p.subgroup_entries:
            if tag not in seen:
                sink.warning("unknown-subgroup", e.path, "nested group tag names no group", e.loc)
        g = p.spec
        if g.final is not None and g.final not in outbounds and p.final_entry is not None:
            e = p.final_entry
            sink.error("unknown-final", e.path, "final names no node, group or builtin outbound", e.loc)
        if g.default is not None and p.default_entry is not None:
            if subscriptions and (g.filters or not g.has_filter_lines):
                continue  # the default may be a subscription node, known only at run time
            if g.default not in members(g, nodes):
                e = p.default_entry
                sink.error("unknown-default", e.path, "default names no member of this group", e.loc)
    return [p.spec for p in kept]


def detour_targets(decls: list[SubscriptionDecl]) -> list[tuple[str, Entry]]:
    """The ``detour`` entries of subscriptions, for :func:`check_targets` (a subscription's
    own nodes cannot carry its download: the name must be declared in the file)."""
    found = []
    for decl in decls:
        for e in decl.entries:
            if e.key == "detour" and isinstance(e.value, str):
                name = V.unquote(e.value) if e.raw else e.value.strip()
                if name:
                    found.append((name, e))
    return found


def check_targets(targets: list[tuple[str, Entry]], outbounds: set[str], sink: Sink) -> None:
    for target, e in targets:
        if target not in outbounds:
            sink.error("unknown-outbound", e.path, "target names no node, group or builtin outbound", e.loc)


# --- membership -------------------------------------------------------------------------


def _arg_matches(key: str, value: str, name: str, builtin: bool) -> bool:
    if key == "":
        return name == value
    if builtin:
        return False  # keyword:/regex: never select direct or block
    if key == "keyword":
        return value in name
    if key == "regex":
        try:
            return re.search(value, name) is not None
        except (re.error, RecursionError, OverflowError):
            return False
    return False


def filter_matches(f: NodeFilter, name: str, *, builtin: bool = False, subscription: str = "") -> bool:
    spelled = False
    for term in f.terms:
        if term.kind == "name":
            hit = any(_arg_matches(a.key, a.value, name, builtin) for a in term.args)
            if hit and not term.negated and any(a.key == "" and a.value == name for a in term.args):
                spelled = True
        else:  # subtag: the tag of the subscription the node came from ('' for configured nodes)
            hit = bool(subscription) and any(
                _arg_matches(a.key, a.value, subscription, builtin) for a in term.args
            )
        if hit == term.negated:
            return False
    return spelled if builtin else True


def members(group: GroupSpec, nodes: list[NodeSpec]) -> set[str]:
    """Names a group may pick: selected nodes, nested tags and spelled builtins."""
    if not group.has_filter_lines:
        return {n.name for n in nodes}
    out = set(group.subgroups)
    for f in group.filters:
        out.update(n.name for n in nodes if filter_matches(f, n.name, subscription=n.subscription))
        out.update(b for b in BUILTIN_OUTBOUNDS if filter_matches(f, b, builtin=True))
    return out
