"""Merged documents -> the parts of a :class:`Spec`.

Docs arrive in merge order (entry file first, then each include and its
descendants). Collections append in that order; for scalar settings the last
occurrence wins. Every problem is reported to the sink with the entry's key
path and location; values never appear in messages.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from dataclasses import dataclass, field

from honk.config import values as V
from honk.config.dnstarget import parse_dns_target
from honk.config.expr import MUST_PREFIX, MUST_RULES, ExprError, parse_filter_line, parse_outbound, parse_rule
from honk.config.links import INBOUND_OPEN_PARAM, LinkError, parse_inbound_url, parse_node_link
from honk.config.policies import parse_policy as parse_close_policy
from honk.config.spec import (
    DEFAULT_CHECK_TOLERANCE,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_SNIFFING_TIMEOUT,
    DIAL_MODES,
    LOG_LEVELS,
    POLICY_SPELLINGS,
    POLICY_STRATEGIES,
    PRECONNECT_AUTO,
    TPROXY_MARK,
    ClashApiSpec,
    GlobalSpec,
    GroupSpec,
    InboundSpec,
    NodeFilter,
    NodeSpec,
    Policy,
    RoutingSpec,
    RuleSpec,
)
from honk.config.tree import Doc, Entry, GroupDecl, Sink
from honk.core.net import is_loopback_listen, parse_host_port

# Durations that must be positive; the other global durations take 0 as "off".
_POSITIVE_DURATIONS = frozenset({"check_interval", "relay_idle_timeout", "udp_idle_timeout"})

# Documented global keys honk accepts but does not use yet: no unknown-key warning.
ACCEPTED_GLOBAL_KEYS = frozenset(
    {
        "tproxy_port_protect",
        "pprof_port",
        "log_file",
        "disable_waiting_network",
        "nfqueue_enable",
        "bootstrap_resolver",
        "bandwidth_max_tx",
        "bandwidth_max_rx",
    }
)

# dae's global keys that change how nodes are dialled, which honk does not honour: a counted
# warning (``not-honoured``) says what honk does instead, unless the value is dae's default,
# which honk already behaves like. None: every value is warned about.
UNHONOURED_GLOBAL_KEYS: dict[str, tuple[str | None, str]] = {
    "allow_insecure": (
        "false",
        "honk verifies every node's certificate unless the node's own link says allowInsecure=1",
    ),
    "tls_implementation": ("tls", "honk's TLS is OpenSSL's; there is no uTLS"),
    "utls_imitate": (None, "honk does not imitate another client's TLS fingerprint"),
    "tls_fragment": ("false", "honk does not fragment its TLS ClientHello"),
    "tls_fragment_length": (None, "honk does not fragment its TLS ClientHello"),
    "tls_fragment_interval": (None, "honk does not fragment its TLS ClientHello"),
    "mptcp": ("false", "honk dials plain TCP"),
    "fallback_resolver": (None, "honk resolves node names with the system resolver"),
}
# dae reads these only when another key switches their feature on (utls_imitate with
# tls_implementation: utls, the fragment sizes with tls_fragment: true); otherwise dae ignores
# them as honk does, and a warning would be a false alarm.
UNHONOURED_ONLY_WITH: dict[str, tuple[str, str]] = {
    "utls_imitate": ("tls_implementation", "utls"),
    "tls_fragment_length": ("tls_fragment", "true"),
    "tls_fragment_interval": ("tls_fragment", "true"),
}

# dae's eBPF and kernel tuning keys: honk's datapath has no such setting (warned, ignored).
DAE_KERNEL_TUNING_KEYS = frozenset(
    {"enable_local_tcp_fast_redirect", "disable_thp", "bpf_conn_state_map_size"}
)

# The global keys build_global reads into GlobalSpec (each has its branch there).
GLOBAL_SPEC_KEYS = frozenset(
    {
        "log_level",
        "tcp_check_url",
        "tcp_check_http_method",
        "udp_check_dns",
        "check_interval",
        "relay_idle_timeout",
        "udp_idle_timeout",
        "shutdown_grace",
        "response_timeout",
        "half_close_timeout",
        "check_tolerance",
        "connect_timeout",
        "max_concurrent_dials",
        "preconnect_node_count",
        "udp_warm_node_count",
        "data_dir",
        "lan_interface",
        "wan_interface",
        "tproxy_port",
        "so_mark_from_dae",
        "dial_mode",
        "sniffing_timeout",
        "drain",
        "user_removal",
        "store_subscribe",
        "auto_config_kernel_parameter",
    }
)
# Every key the global section accepts (read, accepted and unused, or warned about as not honoured);
# any other is an unknown-key warning. docs/configuration.md lists each (its drift test reads this).
GLOBAL_KEYS = (
    GLOBAL_SPEC_KEYS | ACCEPTED_GLOBAL_KEYS | frozenset(UNHONOURED_GLOBAL_KEYS) | DAE_KERNEL_TUNING_KEYS
)

# dae's per-group overrides of the global check settings (config.Group; control_plane.go
# ParseGroupOverrideOption): tcp_check_url becomes the group's check URL, check_interval the
# interval of its probes, check_tolerance its URLTest tolerance; the others are warned about
# (``not-honoured``) with what honk does instead.
DAE_GROUP_CHECK_KEYS = frozenset(
    {"tcp_check_url", "tcp_check_http_method", "udp_check_dns", "check_interval", "check_tolerance"}
)
UNHONOURED_GROUP_KEYS: dict[str, str] = {
    "tcp_check_http_method": "the group's check URL is probed with the global tcp_check_http_method",
    "udp_check_dns": "honk's group checks are TCP only; members' UDP health comes from the global udp_check_dns",
}
DAE_GROUP_KEYS = frozenset(
    {"filter", "policy", "default", "final", "check_url", "interrupt_connections"} | DAE_GROUP_CHECK_KEYS
)
STRUCTURED_GROUP_KEYS = DAE_GROUP_KEYS | {"tolerance", "idle_timeout", "id"}
CLASH_API_KEYS = frozenset({"external_controller", "external_ui", "secret", "default_mode"})
CLASH_API_BOOLS = frozenset({"allow_unauthenticated"})  # honk's own: see build_clash_api
CLASH_API_ACCEPTED = frozenset({"external_ui_download_url", "external_ui_download_detour"})
CLASH_MODES = {"rule": "Rule", "global": "Global", "direct": "Direct"}
CACHE_FILE_BOOLS = frozenset({"enabled", "store_fakeip", "store_dns"})
CACHE_FILE_STRINGS = frozenset({"path", "cache_id"})
MAX_INTERFACE_NAME = 15  # IFNAMSIZ - 1: the kernel's longest interface name


def _unknown(sink: Sink, entry: Entry) -> None:
    sink.warning("unknown-key", entry.path, "unknown key is ignored", entry.loc)


# --- global ----------------------------------------------------------------------------


def _count(g: dict[str, object], entry: Entry, sink: Sink, least: int, message: str) -> None:
    """An integer global key of at least ``least`` into ``g``; otherwise an error with ``message``."""
    n = V.get_int(entry, sink)
    if n is None:
        return
    if n >= least:
        g[entry.key or ""] = n
    else:
        sink.error("invalid-value", entry.path, message, entry.loc)


def build_global(entries: list[Entry], base_dir: str, sink: Sink) -> GlobalSpec:
    g: dict[str, object] = {}
    for e in entries:
        key = e.key or ""
        if key not in GLOBAL_KEYS:
            _unknown(sink, e)
            continue
        if key == "log_level":
            s = V.get_str(e, sink)
            if s is not None:
                if s.lower() in LOG_LEVELS:
                    g[key] = s.lower()
                else:
                    sink.error(
                        "invalid-value", e.path, f"log level must be one of {', '.join(LOG_LEVELS)}", e.loc
                    )
        elif key == "tcp_check_url":
            items = V.get_list(e, sink, aggregates=True)
            if items is not None:
                g[key] = items
        elif key == "tcp_check_http_method":
            s = V.get_str(e, sink)
            if s is not None:
                g[key] = s or "HEAD"
        elif key == "udp_check_dns":
            items = V.get_list(e, sink, aggregates=True)
            if items is not None and all(_check_dns_target(t, i, e, sink) for i, t in enumerate(items)):
                g[key] = items
        elif key in (
            "check_interval",
            "relay_idle_timeout",
            "udp_idle_timeout",
            "shutdown_grace",
            "response_timeout",
            "half_close_timeout",
        ):
            seconds = V.get_seconds(e, sink)
            if seconds is None:
                continue
            if key in _POSITIVE_DURATIONS and seconds <= 0:  # the others: 0 is "none" (off)
                sink.error("invalid-value", e.path, "duration must be positive", e.loc)
                continue
            g[key] = seconds
        elif key in ("check_tolerance", "connect_timeout"):
            default = DEFAULT_CHECK_TOLERANCE if key == "check_tolerance" else DEFAULT_CONNECT_TIMEOUT
            seconds = V.get_millis(e, sink, default)
            if seconds is None:
                continue
            if key == "connect_timeout" and seconds <= 0:
                sink.error("invalid-value", e.path, "timeout must be positive", e.loc)
                continue
            g[key] = seconds
        elif key == "max_concurrent_dials":
            _count(g, e, sink, 1, "must be a positive integer")
        elif key == "preconnect_node_count":
            if isinstance(e.value, str) and V.unquote(e.value).strip().lower() == "auto":
                g[key] = PRECONNECT_AUTO
            else:
                _count(g, e, sink, 0, "must be 'auto' or a count (0 disables)")
        elif key == "udp_warm_node_count":
            _count(g, e, sink, 0, "must be a count (0 disables)")
        elif key == "data_dir":
            s = V.get_str(e, sink)
            if s is not None:
                if not s:
                    sink.error("invalid-value", e.path, "data_dir must not be empty", e.loc)
                else:
                    g[key] = os.path.normpath(os.path.join(base_dir, os.path.expanduser(s)))
        elif key in ("lan_interface", "wan_interface"):
            items = V.get_list(e, sink)
            if items is not None:
                g[key] = tuple(i for i in (x.strip() for x in items) if i)
                for name in g[key]:
                    if len(name) > MAX_INTERFACE_NAME or "/" in name or name in (".", ".."):
                        sink.error("invalid-value", e.path, f"{name!r} is not an interface name", e.loc)
        elif key in ("tproxy_port", "so_mark_from_dae"):
            n = _get_mark(e, sink) if key == "so_mark_from_dae" else V.get_int(e, sink)
            if n is None:
                continue
            if key == "tproxy_port" and not 0 < n < 65536:
                sink.error("invalid-value", e.path, "tproxy_port must be a port number (1-65535)", e.loc)
            elif key == "so_mark_from_dae" and (n < 0 or n & TPROXY_MARK):
                sink.error(
                    "invalid-value", e.path, "so_mark_from_dae must not use the tproxy mark's bit", e.loc
                )
            else:
                g[key] = n
        elif key == "dial_mode":
            s = V.get_str(e, sink)
            if s is not None:
                if s.strip().lower() in DIAL_MODES:
                    g[key] = s.strip().lower()
                else:
                    sink.error(
                        "invalid-value", e.path, f"dial_mode must be one of {', '.join(DIAL_MODES)}", e.loc
                    )
        elif key == "sniffing_timeout":
            seconds = V.get_millis(e, sink, DEFAULT_SNIFFING_TIMEOUT)
            if seconds is not None:
                g[key] = seconds
        elif key in ("drain", "user_removal"):
            text = V.get_str(e, sink)
            if text is not None:
                try:
                    g[key] = parse_close_policy(text, V.parse_seconds)
                except ValueError as exc:
                    sink.error("invalid-value", e.path, f"{key} {exc}", e.loc)
        elif key in ("store_subscribe", "auto_config_kernel_parameter"):
            flag = V.get_bool(e, sink)
            if flag is not None:
                g[key] = flag
        elif key in ACCEPTED_GLOBAL_KEYS:
            continue
        elif key in UNHONOURED_GLOBAL_KEYS:
            default, instead = UNHONOURED_GLOBAL_KEYS[key]
            value = V.get_str(e, sink)
            switch = UNHONOURED_ONLY_WITH.get(key)
            if switch is not None and not any(
                o.key == switch[0]
                and isinstance(o.value, str)
                and V.unquote(o.value).strip().lower() == switch[1]
                for o in entries
            ):
                continue  # its feature is off: dae ignores the key too
            if value is not None and (default is None or value.strip().lower() != default):
                sink.warning("not-honoured", e.path, f"{key} is ignored: {instead}", e.loc)
        elif key in DAE_KERNEL_TUNING_KEYS:
            sink.warning(
                "not-honoured", e.path, f"{key} is dae's eBPF tuning; honk has no such setting", e.loc
            )
        else:
            _unknown(sink, e)
    return GlobalSpec(**g)  # type: ignore[arg-type]


def _get_mark(e: Entry, sink: Sink) -> int | None:
    """A socket mark: an integer, decimal or ``0x`` hexadecimal."""
    if isinstance(e.value, int) and not isinstance(e.value, bool):
        return e.value
    text = V.get_str(e, sink)
    if text is None:
        return None
    try:
        return int(text.strip(), 0)
    except ValueError:
        sink.error("invalid-value", e.path, "expected an integer (decimal or 0x hexadecimal)", e.loc)
        return None


def _check_dns_target(target: str, index: int, e: Entry, sink: Sink) -> bool:
    """``host``, ``host:port``, IPv4, bare IPv6, ``[IPv6]`` or ``[IPv6]:port`` (the probe's own parser)."""
    try:
        parse_dns_target(target.strip())
    except ValueError as exc:
        sink.error("invalid-value", e.path, f"entry {index}: {exc}", e.loc)
        return False
    return True


# --- inbounds and nodes ----------------------------------------------------------------------


def _parse_entries(entries: list[Entry], parse, sink: Sink) -> list[tuple[object, Entry]]:
    """Parse each entry's link with ``parse(text, tag)``; a refusal becomes a located error."""
    out = []
    for e in entries:
        text = V.get_str(e, sink)
        if text is None:
            continue
        try:
            parsed = parse(text, e.key)
        except LinkError as exc:
            sink.error(exc.code, e.path, exc.message, e.loc)
            continue
        out.append((dataclasses.replace(parsed, loc=e.loc), e))
    return out


def build_inbounds(entries: list[Entry], sink: Sink) -> list[InboundSpec]:
    out = []
    for spec, e in _parse_entries(entries, parse_inbound_url, sink):
        out.append(spec)
        if spec.kind != "mixed" or spec.users or is_loopback_listen(spec.host):
            continue
        if spec.allow_unauthenticated:
            sink.warning(
                "open-proxy",
                e.path,
                f"{spec.host} is not loopback and the inbound has no users: "
                "anyone who reaches it may proxy through this router (allowed by "
                f"{INBOUND_OPEN_PARAM})",
                e.loc,
            )
        else:
            sink.error(
                "open-proxy",
                e.path,
                f"{spec.host} is not loopback and the inbound has no users: an open "
                "proxy; add user:password@ to the URL, listen on 127.0.0.1, or, on a network you "
                f"trust, append ?{INBOUND_OPEN_PARAM}=true",
                e.loc,
            )
    return out


def build_nodes(entries: list[Entry], sink: Sink) -> list[tuple[NodeSpec, Entry]]:
    return _parse_entries(entries, parse_node_link, sink)


# --- groups ---------------------------------------------------------------------------


def parse_policy(text: str) -> Policy | None:
    s = text.strip()
    if s.endswith(")") and "(" in s:
        s = s[: s.index("(")].strip()
    return POLICY_SPELLINGS.get(s.lower()) if s.isascii() else None


@dataclass(slots=True)
class GroupParts:
    spec: GroupSpec
    decl: GroupDecl
    default_entry: Entry | None = None
    final_entry: Entry | None = None
    subgroup_entries: list[tuple[str, Entry]] = field(default_factory=list)


def build_groups(decls: list[GroupDecl], tolerance: float, sink: Sink) -> list[GroupParts]:
    out: list[GroupParts] = []
    for decl in decls:
        out.append(_build_group(decl, tolerance, sink))
    return out


def _build_group(decl: GroupDecl, tolerance: float, sink: Sink) -> GroupParts:
    allowed = STRUCTURED_GROUP_KEYS if decl.structured else DAE_GROUP_KEYS
    policy = Policy.SELECTOR
    strategy = ""
    fixed_index: int | None = None
    filters: list[NodeFilter] = []
    subgroups: list[str] = []
    has_filter_lines = False
    values: dict[str, object] = {}
    parts_default: Entry | None = None
    parts_final: Entry | None = None
    sub_entries: list[tuple[str, Entry]] = []
    check_url_entry: Entry | None = None
    interval_entry: Entry | None = None
    for e in decl.entries:
        key = e.key or ""
        if key not in allowed:
            _unknown(sink, e)
            continue
        if key == "filter":
            text = e.value
            if not isinstance(text, str):
                sink.error("invalid-type", e.path, "expected a filter string", e.loc)
                continue
            has_filter_lines = True
            line = parse_filter_line(text, e.path, e.loc, sink)
            if line.kind == "groups":
                subgroups.extend(line.groups)
                sub_entries.extend((t, e) for t in line.groups)
            elif line.kind == "filter" and line.node_filter is not None:
                filters.append(line.node_filter)
        elif key == "policy":
            s = V.get_str(e, sink)
            if s is None:
                continue
            found = parse_policy(s)
            known = found is not None
            if found is None:
                sink.warning(
                    "unknown-policy",
                    e.path,
                    f"group '{decl.name}' has an unrecognised policy; using selector",
                    e.loc,
                )
                found = Policy.SELECTOR
            policy, strategy, fixed_index = found, "", None
            head, paren, arg = s.strip().partition("(")
            head = head.strip().lower()
            if known:  # a spelling read, so s ends with ")" when it has "(" (parse_policy)
                strategy = POLICY_STRATEGIES.get(head, "")
                arg = arg[:-1].strip() if paren else ""
                if head == "fixed" and arg:
                    if not (arg.isascii() and arg.isdigit()):
                        sink.error(
                            "invalid-value",
                            e.path,
                            "fixed(N) takes a member index: a whole number from 0",
                            e.loc,
                        )
                        continue
                    fixed_index = int(arg) or None  # fixed(0) is plain fixed: the first member
        elif key in ("default", "final", "check_url"):
            s = V.get_str(e, sink)
            if s is None:
                continue
            if not s:
                sink.error("invalid-value", e.path, "must not be empty", e.loc)
                continue
            values[key] = s
            if key == "default":
                parts_default = e
            elif key == "final":
                parts_final = e
            else:
                check_url_entry = e
        elif key == "tcp_check_url":  # dae: the group's own check URL (the first entry)
            items = V.get_list(e, sink, aggregates=True)
            if items is None:
                continue
            if not items or not items[0].strip():
                sink.error("invalid-value", e.path, "must not be empty", e.loc)
                continue
            if len(items) > 1:
                sink.warning(
                    "not-honoured",
                    e.path,
                    "only the first tcp_check_url entry is used: it is the "
                    "group's check URL, probed at the address its host resolves to",
                    e.loc,
                )
            values["check_url"] = items[0].strip()
            check_url_entry = e
        elif key in ("tolerance", "check_tolerance"):
            seconds = V.get_millis(e, sink, tolerance)
            if seconds is None or (key == "check_tolerance" and seconds == 0):
                continue  # dae: a group's check_tolerance of 0 keeps the global one
            values["tolerance"] = seconds
        elif key == "check_interval":
            seconds = V.get_seconds(e, sink)
            if seconds is None or seconds == 0:
                continue  # dae: a group's check_interval of 0 keeps the global one
            if seconds < 0:
                sink.error("invalid-value", e.path, "duration must be positive", e.loc)
                continue
            values[key] = seconds
            interval_entry = e
        elif key in UNHONOURED_GROUP_KEYS:
            if e.value not in ("", None):
                sink.warning("not-honoured", e.path, f"{key} is ignored: {UNHONOURED_GROUP_KEYS[key]}", e.loc)
        elif key == "idle_timeout":
            seconds = V.get_seconds(e, sink)
            if seconds is not None:
                if seconds <= 0:
                    sink.error("invalid-value", e.path, "duration must be positive", e.loc)
                else:
                    values[key] = seconds
        elif key == "interrupt_connections":
            flag = V.get_bool(e, sink)
            if flag is not None:
                values[key] = flag
        elif key == "id":
            s = V.get_str(e, sink)
            if s is not None:
                try:
                    values[key] = uuid.UUID(s)
                except ValueError:
                    sink.error("invalid-value", e.path, "not a UUID", e.loc)
    if check_url_entry is not None and policy is Policy.SELECTOR:
        sink.warning(
            "ineffective-option",
            check_url_entry.path,
            f"a selector group ignores {check_url_entry.key}",
            check_url_entry.loc,
        )
    if interval_entry is not None and check_url_entry is None:
        sink.warning(
            "not-honoured",
            interval_entry.path,
            "check_interval is ignored: the group has no check URL (tcp_check_url), so its members are "
            "checked by the global checks at the global check_interval",
            interval_entry.loc,
        )
        values.pop("check_interval")
    elif interval_entry is not None and policy is Policy.SELECTOR:
        sink.warning(
            "ineffective-option",
            interval_entry.path,
            "a selector group ignores check_interval",
            interval_entry.loc,
        )
    spec = GroupSpec(
        name=decl.name,
        policy=policy,
        filters=tuple(filters),
        subgroups=tuple(subgroups),
        has_filter_lines=has_filter_lines,
        default=values.get("default"),  # type: ignore[arg-type]
        final=values.get("final"),  # type: ignore[arg-type]
        check_url=values.get("check_url"),  # type: ignore[arg-type]
        check_interval=values.get("check_interval"),  # type: ignore[arg-type]
        tolerance=values.get("tolerance", tolerance),  # type: ignore[arg-type]
        idle_timeout=values.get("idle_timeout"),  # type: ignore[arg-type]
        interrupt_connections=bool(values.get("interrupt_connections", False)),
        id=values.get("id"),  # type: ignore[arg-type]
        strategy=strategy,
        fixed_index=fixed_index,
        loc=decl.loc,
    )
    return GroupParts(spec, decl, parts_default, parts_final, sub_entries)


# --- routing ---------------------------------------------------------------------------


def build_routing(
    rules: list[Entry], fallbacks: list[Entry], sink: Sink
) -> tuple[list[tuple[RuleSpec, Entry]], str, Entry | None]:
    out: list[tuple[RuleSpec, Entry]] = []
    for e in rules:
        if not isinstance(e.value, str):
            sink.error("invalid-type", e.path, "expected a rule string", e.loc)
            continue
        rule = parse_rule(e.value, e.path, e.loc, sink)
        if rule is not None:
            out.append((rule, e))
    fallback = RoutingSpec().fallback
    fallback_entry: Entry | None = None
    for e in fallbacks:
        s = V.get_str(e, sink)
        if s is None:
            continue
        if not s:
            sink.error("invalid-value", e.path, "fallback must name an outbound", e.loc)
            continue
        fallback, fallback_entry = s, e
    return out, fallback, fallback_entry


def split_fallback_must(fallback: str, entry: Entry | None, sink: Sink) -> tuple[str, bool, int | None]:
    """The fallback target as a rule's is read: dae's ``fallback: must_<name>`` (config/patch.go
    strips the prefix there too), ``<name>(must)`` and ``direct(mark: N)`` (upstream honk's
    fallback takes both): the outbound, whether it is a must decision, and its socket mark."""
    if fallback == MUST_PREFIX or fallback == MUST_RULES:
        return fallback, False, None
    try:
        target = parse_outbound(fallback)
    except ExprError as exc:
        if entry is not None:
            sink.error("invalid-value", entry.path, str(exc), entry.loc)
        return fallback, False, None
    return target.name, target.must, target.mark


# --- experimental -------------------------------------------------------------------------


def build_clash_api(entries: list[Entry] | None, sink: Sink) -> ClashApiSpec | None:
    if entries is None:
        return None
    v: dict[str, str | bool] = {}
    found: dict[str, Entry] = {}
    for e in entries:
        key = e.key or ""
        if key in CLASH_API_ACCEPTED:
            V.get_str(e, sink)
            continue
        if key in CLASH_API_BOOLS:
            flag = V.get_bool(e, sink)
            if flag is not None:
                v[key] = flag
                found[key] = e
            continue
        if key not in CLASH_API_KEYS:
            _unknown(sink, e)
            continue
        s = V.get_str(e, sink)
        if s is None:
            continue
        if key == "default_mode":
            mode = CLASH_MODES.get(s.lower())
            if mode is None:
                sink.warning(
                    "invalid-value", e.path, "mode must be Rule, Global or Direct; using Rule", e.loc
                )
                mode = "Rule"
            s = mode
        if key == "external_controller":
            try:
                parse_host_port(s)
            except ValueError as exc:
                sink.error("invalid-value", e.path, f"external_controller: {exc}", e.loc)
                continue
        v[key] = s
        found[key] = e
    spec = ClashApiSpec(**v)
    _check_open_api(spec, found, sink)
    return spec


def _check_open_api(spec: ClashApiSpec, found: dict[str, Entry], sink: Sink) -> None:
    """A controller every host on the network reaches, without a secret, lets any of them switch
    nodes, read every connection and reload the router: an error unless the file allows it."""
    host, _ = parse_host_port(spec.external_controller)
    if spec.secret or is_loopback_listen(host):
        return
    at = found["external_controller"]  # the default controller is loopback
    if spec.allow_unauthenticated:
        allowed = found["allow_unauthenticated"]
        sink.warning(
            "open-api",
            allowed.path,
            f"the API on {spec.external_controller} has no secret: anyone "
            "who reaches it controls this router (allowed by allow_unauthenticated)",
            allowed.loc,
        )
        return
    sink.error(
        "open-api",
        at.path,
        f"the API on {spec.external_controller} is not loopback and has no secret: "
        "set a secret, listen on 127.0.0.1, or, on a network you trust, set allow_unauthenticated: true",
        at.loc,
    )


def check_cache_file(entries: list[Entry] | None, sink: Sink) -> None:
    """``cache_file`` is read and checked; nothing in the Spec uses it yet."""
    for e in entries or []:
        key = e.key or ""
        if key in CACHE_FILE_BOOLS:
            V.get_bool(e, sink)
        elif key in CACHE_FILE_STRINGS:
            V.get_str(e, sink)
        else:
            _unknown(sink, e)


def merge(docs: list[Doc]) -> Doc:
    merged = Doc(file=docs[0].file if docs else "", fmt=docs[0].fmt if docs else "dae")
    for d in docs:
        merged.global_.extend(d.global_)
        merged.inbounds.extend(d.inbounds)
        merged.nodes.extend(d.nodes)
        merged.subscriptions.extend(d.subscriptions)
        merged.groups.extend(d.groups)
        merged.rules.extend(d.rules)
        merged.fallbacks.extend(d.fallbacks)
        if d.clash_api is not None:
            merged.clash_api = (merged.clash_api or []) + d.clash_api
        if d.cache_file is not None:
            merged.cache_file = (merged.cache_file or []) + d.cache_file
        if d.dns is not None:
            merged.dns = (merged.dns or []) + d.dns
        merged.assets.extend(d.assets)
    return merged
