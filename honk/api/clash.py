"""The Clash API (contract: docs/design clash-api.md) for metacubexd, zashboard and Yacd-meta.

Handlers are thin: they read the inputs (the published plane, health, the
tracker, the routing mode), hand them to :mod:`honk.api.clash_views`, and send
the result; every write goes through the daemon's serialized writer
(``select``, ``pin``, ``select_global``, ``reload``, ``refresh_subscription``).
Errors are :class:`~honk.api.errors.ApiError`; the server renders them as
``{"message": …}`` with mihomo's status codes.

Names in paths are decoded by the router, and once more when the result names
nothing (mihomo unescapes its router parameter again; a client that encodes a
name twice still reaches it). ``DIRECT`` and ``REJECT`` are honk's ``direct`` and
``block``.

``PATCH /configs`` applies ``mode`` and ``log-level``; like mihomo it ignores
keys it does not apply (logged at debug). ``PUT /configs`` reloads honk's own
configuration file and nothing else: it never writes a file.

``GET /dns/query`` asks honk's own DNS service, the way a LAN client's query
goes (request rules, cache, upstream; it is counted and cached like one), and
answers in mihomo's JSON (hub/route/dns.go: miekg's message fields); ``POST
/cache/dns/flush`` empties the answer cache. Without a dns section the query
is mihomo's 500 "DNS section is disabled" and the flush is a 204 that drops
nothing, as mihomo's is.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from aiohttp import web

from honk import __version__
from honk.api import clash_views as views
from honk.api import streams
from honk.api.context import Control, running_plane
from honk.api.delay import (
    DelayResult,
    leaf_of,
    parse_expected,
    parse_timeout,
    test_group,
    test_leaf,
    test_members,
)
from honk.api.errors import ApiError, bad_request, not_found, refused
from honk.api.jsonio import encode_each, reply, stream_json, text_reply
from honk.config.spec import InboundSpec, Policy, Spec
from honk.connection.mode import MODES
from honk.connection.plane import Plane
from honk.connection.warm import pool_stats, warm_stats
from honk.control.errors import ApplyError
from honk.core.clock import timeout_at
from honk.core.logs import LEVELS, daemon_level
from honk.group.policy import UnknownGroup, UnknownMember
from honk.outbound.base import Outbound

if TYPE_CHECKING:
    import dns.message

log = logging.getLogger("honk.api.clash")

DELAY_FAILED = "An error occurred in the delay test"  # mihomo's 503 message
MUST_BE_SELECTOR = "Must be a Selector"  # mihomo's 400 message for a group it cannot set
CLOSE_CONFIRM = 2.0  # seconds DELETE /connections/{id} waits for the flow to leave the table
OWN_FILE_ONLY = "honk reloads only its own configuration file"
# /logs levels: the Clash spellings (trace shows debug, as mihomo has no trace) and honk's "warn"
LOG_LEVELS = {
    "trace": "debug",
    "debug": "debug",
    "info": "info",
    "warning": "warning",
    "warn": "warning",
    "error": "error",
    "silent": "silent",
}
DNS_DISABLED = "DNS section is disabled"  # mihomo's 500 message for /dns/query without a dns section
INVALID_QTYPE = "invalid query type"  # mihomo's 400 message for a type it does not know
INVALID_QNAME = "invalid query name"
DEFAULT_QTYPE = "A"  # /dns/query without ?type=


def no_content() -> web.Response:
    return web.Response(status=204)


async def json_body(request: web.Request, *, empty_ok: bool = False) -> dict[str, Any]:
    """The body as a JSON object; 400 "Body invalid" otherwise."""
    raw = await request.read()
    if not raw.strip() and empty_ok:
        return {}
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise bad_request() from None
    if not isinstance(body, dict):
        raise bad_request()
    return body


def path_names(request: web.Request, key: str = "name") -> tuple[str, ...]:
    """The path parameter as the router decoded it, then decoded once more if that differs."""
    raw = request.match_info[key]
    again = unquote(raw)
    return (raw,) if again == raw else (raw, again)


# --- /dns/query -------------------------------------------------------------------------------


def dns_question(name: str, qtype: str) -> dns.message.Message:
    """The recursive query ``/dns/query?name=&type=`` asks (an empty name is the root, as in
    mihomo), with the EDNS payload a LAN client's resolver typically offers; 400 for a type
    that is no record type (mihomo's message) or a name that is no DNS name. Types are read
    case-insensitively, where mihomo wants them upper case."""
    import dns.exception
    import dns.message
    import dns.name
    import dns.rdatatype

    from honk.dns.wire import UDP_MAX_PAYLOAD

    try:
        rdtype = dns.rdatatype.from_text(qtype)
    except (dns.rdatatype.UnknownRdatatype, ValueError):
        raise bad_request(INVALID_QTYPE) from None
    if dns.rdatatype.is_metatype(rdtype):  # OPT, AXFR, ANY...: not a question a resolver forwards
        raise bad_request(INVALID_QTYPE)
    try:
        qname = dns.name.from_text(name or ".")
    except dns.exception.DNSException:
        raise bad_request(INVALID_QNAME) from None
    return dns.message.make_query(qname, rdtype, use_edns=0, payload=UDP_MAX_PAYLOAD)


def dns_record_json(name: Any, rdtype: int, ttl: int, rdata: Any) -> dict[str, Any]:
    """One record as mihomo renders it: owner with its final dot, numeric type, TTL, and the
    record's data in presentation format (what follows the header in the zone-file line)."""
    return {"name": name.to_text(), "type": int(rdtype), "TTL": ttl, "data": rdata.to_text()}


def dns_section_json(section: list[Any]) -> list[dict[str, Any]]:
    return [
        dns_record_json(rrset.name, rrset.rdtype, rrset.ttl, rdata) for rrset in section for rdata in rrset
    ]


def dns_query_json(message: dns.message.Message) -> dict[str, Any]:
    """``message`` in mihomo's ``/dns/query`` shape: the header bits, the question as miekg's
    struct (``Name``, ``Qtype``, ``Qclass``), and Answer, Authority, Additional only when not
    empty. Keys sorted, as Go encodes a map."""
    import dns.flags

    flags = message.flags
    body: dict[str, Any] = {
        "Status": message.rcode(),
        "Question": [
            {"Name": rrset.name.to_text(), "Qtype": int(rrset.rdtype), "Qclass": int(rrset.rdclass)}
            for rrset in message.question
        ],
        "TC": bool(flags & dns.flags.TC),
        "RD": bool(flags & dns.flags.RD),
        "RA": bool(flags & dns.flags.RA),
        "AD": bool(flags & dns.flags.AD),
        "CD": bool(flags & dns.flags.CD),
    }
    for key, section in (
        ("Answer", message.answer),
        ("Authority", message.authority),
        ("Additional", message.additional),
    ):
        if section:
            body[key] = dns_section_json(section)
    return dict(sorted(body.items()))


def clash_log_level(levelno: int) -> str:
    """The running log level in Clash's words."""
    if levelno <= logging.DEBUG:
        return "debug"
    if levelno <= logging.INFO:
        return "info"
    if levelno <= logging.WARNING:
        return "warning"
    if levelno <= logging.ERROR:
        return "error"
    return "silent"


def routes(control: Control) -> list[web.RouteDef]:
    """Every Clash endpoint, closing over the daemon."""

    # --- reading the running state ------------------------------------------------------------

    def context() -> views.ProxyContext:
        plane = running_plane(control)
        health = control.health
        return views.ProxyContext(plane, health.alive, health.group_checks, control.mode.global_choice)

    def resolve(ctx: views.ProxyContext, request: web.Request, key: str = "name") -> str:
        """The honk name a path parameter names; 404 when none."""
        for candidate in path_names(request, key):
            name = views.lookup(ctx, candidate)
            if name is not None:
                return name
        raise not_found()

    def policy_of(ctx: views.ProxyContext, group: str) -> Policy | None:
        spec = ctx.group_spec(group)
        return spec.policy if spec is not None else None

    def subscription_infos() -> list[views.ProviderInfo]:
        manager = control.subscriptions
        if manager is None:
            return []
        return [views.ProviderInfo(state.name, state.updated_at, state.usage) for state in manager.states()]

    def delay_reply(result: DelayResult) -> web.Response:
        if result.ok:
            assert result.delay is not None
            return reply({"delay": views.delay_ms(result.delay)})
        if result.timed_out:
            raise ApiError(504, "timeout", "Timeout")
        raise ApiError(503, "delay_failed", DELAY_FAILED)

    def delay_query(request: web.Request) -> tuple[str | None, float, frozenset[int] | None]:
        query = request.query
        return (
            query.get("url") or None,
            parse_timeout(query.get("timeout")),
            parse_expected(query.get("expected")),
        )

    def leaf_pairs(names: Sequence[str]) -> list[tuple[str, Outbound]]:
        pairs = []
        for name in names:
            try:
                pairs.append((name, leaf_of(control, name)))
            except ApiError:
                continue  # a group with no current pick has nothing to measure
        return pairs

    # --- tier 0 ----------------------------------------------------------------------------------

    async def version(request: web.Request) -> web.StreamResponse:
        return reply({"meta": True, "version": f"honk {__version__}"})

    # --- proxies ---------------------------------------------------------------------------------

    async def get_proxies(request: web.Request) -> web.StreamResponse:
        ctx = context()
        entries = await encode_each(views.listed(ctx), lambda name: views.proxy_entry(ctx, name))
        return await stream_json(request, views.PROXIES_HEAD, entries, views.PROXIES_TAIL)

    async def get_proxy(request: web.Request) -> web.StreamResponse:
        ctx = context()
        name = resolve(ctx, request)
        if name == views.GLOBAL and ctx.has_synthetic_global():
            found = views.global_proxy(ctx)
        else:
            found = views.proxy(ctx, name)
        if found is None:
            raise not_found()
        return reply(found)

    async def put_proxy(request: web.Request) -> web.StreamResponse:
        ctx = context()
        name = resolve(ctx, request)
        body = await json_body(request)
        wanted = body.get("name")
        if not isinstance(wanted, str) or not wanted:
            raise bad_request()
        if name == views.GLOBAL and name not in ctx.groups:
            members = views.global_members(ctx.plane)
            member = views.honk_name(wanted, members)
            if member not in members:
                raise bad_request(f"{wanted} is not a member of GLOBAL", "member_not_found")
            try:
                await control.select_global(member)
            except UnknownMember:  # a reload removed it meanwhile
                raise bad_request(f"{wanted} is not a member of GLOBAL", "member_not_found") from None
            return no_content()
        policy = policy_of(ctx, name)
        if policy is None or policy not in (Policy.SELECTOR, *views.PINNABLE):
            raise bad_request(MUST_BE_SELECTOR, "not_a_selector")  # a leaf, LoadBalance or Score
        member = views.honk_name(wanted, ctx.groups.members(name))
        try:
            if policy is Policy.SELECTOR:
                await control.select(name, member, None)
            else:
                await control.pin(name, member, None)
        except UnknownMember:
            raise bad_request(f"{wanted} is not a member of {name}", "member_not_found") from None
        except UnknownGroup:
            raise not_found() from None
        except RuntimeError:
            raise ApiError(503, "not_running", "honk is not running") from None
        return no_content()

    async def delete_proxy(request: web.Request) -> web.StreamResponse:
        ctx = context()
        name = resolve(ctx, request)
        if policy_of(ctx, name) not in views.PINNABLE:
            raise bad_request("Must be a URLTest or Fallback", "not_fixable")
        try:
            await control.pin(name, None, None)
        except UnknownGroup:
            raise not_found() from None
        return no_content()

    async def proxy_delay(request: web.Request) -> web.StreamResponse:
        url, timeout, expected = delay_query(request)
        ctx = context()
        name = resolve(ctx, request)
        if name == views.GLOBAL and name not in ctx.groups:
            name = ctx.global_choice
        return delay_reply(await test_leaf(control, leaf_of(control, name), url, timeout, expected))

    # --- groups ----------------------------------------------------------------------------------

    async def get_groups(request: web.Request) -> web.StreamResponse:
        ctx = context()
        return reply(views.groups_list(ctx))

    async def get_group(request: web.Request) -> web.StreamResponse:
        ctx = context()
        name = resolve(ctx, request)
        if name == views.GLOBAL and name not in ctx.groups:
            return reply(views.global_proxy(ctx))
        if name not in ctx.groups:
            raise not_found()
        return reply(views.group_proxy(ctx, name))

    async def group_delay(request: web.Request) -> web.StreamResponse:
        url, timeout, expected = delay_query(request)
        ctx = context()
        name = resolve(ctx, request)
        if name == views.GLOBAL and name not in ctx.groups:
            results = await test_members(
                control, leaf_pairs(views.global_members(ctx.plane)), url, timeout, expected
            )
        elif name in ctx.groups:
            if policy_of(ctx, name) in views.PINNABLE:
                try:
                    await control.pin(name, None, None)  # as mihomo: a test unfixes
                except UnknownGroup:  # a reload removed it meanwhile
                    raise not_found() from None
            results = await test_group(control, name, url, timeout, expected)
        else:
            raise not_found()
        delays = {
            views.clash_name(member): views.delay_ms(result.delay)
            for member, result in results.items()
            if result.delay is not None
        }
        if not delays:
            raise ApiError(504, "timeout", "Timeout")
        return reply(delays)

    # --- providers -------------------------------------------------------------------------------

    async def get_providers(request: web.Request) -> web.StreamResponse:
        ctx = context()
        subscriptions = subscription_infos()
        members = views.provider_members(ctx, subscriptions)
        names = dict.fromkeys(name for listed in members.values() for name in listed)
        await encode_each(names, lambda name: views.proxy_json(ctx, name))
        entries = await encode_each(members, lambda name: views.provider_entry(ctx, subscriptions, name))
        return await stream_json(request, views.PROVIDERS_HEAD, entries, views.PROVIDERS_TAIL)

    async def get_provider(request: web.Request) -> web.StreamResponse:
        ctx = context()
        subscriptions = subscription_infos()
        for candidate in path_names(request, "provider"):
            members = views.provider_members(ctx, subscriptions).get(candidate)
            if members is not None:
                await encode_each(members, lambda name: views.proxy_json(ctx, name))
                return text_reply(views.provider_json(ctx, subscriptions, candidate) or "")
        raise not_found()

    async def put_provider(request: web.Request) -> web.StreamResponse:
        ctx = context()
        subscriptions = [info.name for info in subscription_infos()]
        for candidate in path_names(request, "provider"):
            if candidate in subscriptions:
                try:
                    accepted = await control.refresh_subscription(candidate)
                except KeyError:
                    raise not_found() from None
                if not accepted:
                    raise ApiError(503, "update_failed", f"provider {candidate} could not be updated")
                return no_content()
            if candidate == "default" or candidate in ctx.groups:
                return no_content()  # a Compatible provider has nothing to fetch (mihomo: no-op)
        raise not_found()

    async def provider_healthcheck(request: web.Request) -> web.StreamResponse:
        ctx = context()
        subscriptions = [info.name for info in subscription_infos()]
        for candidate in path_names(request, "provider"):
            names = views.provider_leaves(ctx, candidate, subscriptions)
            if names is not None:
                # mihomo takes no query here; honk also honours the delay test's url, timeout, expected
                url, timeout, expected = delay_query(request)
                url = url or ctx.test_url(candidate if candidate in ctx.groups else None)
                await test_members(control, leaf_pairs(names), url, timeout, expected)
                return no_content()
        raise not_found()

    async def provider_node_healthcheck(request: web.Request) -> web.StreamResponse:
        ctx = context()
        subscriptions = [info.name for info in subscription_infos()]
        if not any(
            views.provider_leaves(ctx, c, subscriptions) is not None for c in path_names(request, "provider")
        ):
            raise not_found()
        return await proxy_delay(request)

    # --- rules -----------------------------------------------------------------------------------

    async def get_rules(request: web.Request) -> web.StreamResponse:
        plane = running_plane(control)
        return reply(views.rules(plane.spec, plane.router.stats.rows()))

    async def patch_rules_disable(request: web.Request) -> web.StreamResponse:
        # {"3": true} disables rule 3 until re-enabled or a reload recompiles the rules; all or nothing
        body = await json_body(request)
        stats = running_plane(control).router.stats
        try:
            changes = views.rule_changes(body, stats.size)
            stats.set_disabled(changes)
        except ValueError as exc:
            raise bad_request(str(exc)) from None
        for verb, flag in (("disabled", True), ("enabled", False)):
            indexes = sorted(index for index, value in changes.items() if value is flag)
            if indexes:
                log.info("rules %s through the API: %s", verb, ", ".join(map(str, indexes)))
        return no_content()

    async def get_rule_providers(request: web.Request) -> web.StreamResponse:
        return reply({"providers": {}})

    # --- connections -----------------------------------------------------------------------------

    def snapshot() -> dict[str, Any]:
        plane = running_plane(control)
        inbounds = {}
        live = control.inbounds
        for spec in plane.spec.inbounds:
            bound = getattr(live.get(spec.name), "bound", None)
            inbounds[spec.name] = views.InboundInfo(spec.kind, spec.host, bound.port if bound else spec.port)
        return views.connections(
            control.tracker.snapshot(),
            control.tracker.totals(),
            streams.read_rss(),
            views.rule_index(plane.spec),
            inbounds,
        )

    async def get_connections(request: web.Request) -> web.StreamResponse:
        try:
            tick = streams.interval_of(request.query.get("interval"))
        except ValueError:
            raise bad_request("interval must be whole positive milliseconds") from None
        running_plane(control)
        if streams.wants_websocket(request) or request.query.get("stream", "").lower() == "true":
            return await streams.serve(request, streams.connection_frames(control, snapshot, tick), control)
        return reply(snapshot())

    async def delete_connections(request: web.Request) -> web.StreamResponse:
        await control.close_flows(None, "closed through the API")
        return no_content()

    async def delete_connection(request: web.Request) -> web.StreamResponse:
        flow_id = request.match_info["id"]
        if await control.close_flows([flow_id], "closed through the API"):
            # answered once the flow left the table, so the next snapshot no longer shows it
            try:
                async with timeout_at(control.clock, control.clock.now() + CLOSE_CONFIRM):
                    await control.tracker.wait_gone([flow_id])
            except TimeoutError:
                log.debug("closed flow still ending %s", flow_id)
        return no_content()

    # --- configs ---------------------------------------------------------------------------------

    def mixed_port(plane: Plane) -> int:
        live = control.inbounds
        for spec in plane.spec.inbounds:
            if spec.kind == "mixed":
                bound = getattr(live.get(spec.name), "bound", None)
                return bound.port if bound is not None else spec.port
        return 0

    async def get_stats(request: web.Request) -> web.StreamResponse:
        plane = running_plane(control)
        tracker = control.tracker
        warm = getattr(control, "warm", None)
        return reply(
            views.stats(
                plane.outbounds,
                control.stats.outbounds,
                tracker.bytes_by_leaf(),
                tracker.snapshot(),
                plane.groups.score.stats(),
                control.stats.udp_stagger.as_dict(),
                pool_stats(plane),
                warm_stats(plane, warm) if warm is not None else None,
            )
        )

    async def get_configs(request: web.Request) -> web.StreamResponse:
        plane = running_plane(control)
        level = clash_log_level(daemon_level())  # not the logger's: a debug /logs reader lowers that
        return reply(views.configs(plane.spec, control.mode.mode, level, mixed_port(plane)))

    async def patch_configs(request: web.Request) -> web.StreamResponse:
        allow_disruptive = request.query.get("allow_disruptive", "").lower() in ("true", "1", "yes")
        body = await json_body(request)
        mode = body.get("mode")
        level = body.get("log-level")
        port = body.get("mixed-port")
        if mode is not None and (not isinstance(mode, str) or mode.lower() not in MODES):
            raise bad_request("mode must be rule, global or direct")
        if level is not None and (not isinstance(level, str) or level.lower() not in LEVELS):
            raise bad_request(f"log-level must be one of {', '.join(LEVELS)}")
        if port is not None and (
            not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535
        ):
            raise bad_request("mixed-port must be a port number (0 removes the mixed inbound)")

        def runtime() -> None:  # the mode is no resource: it follows a successful apply, in the same command
            if mode is not None:
                control.mode.set(mode)

        edits = [with_mixed_port(port)] if port is not None else []
        if level is not None:
            edits.append(with_log_level(level.lower()))
        try:
            await control.update(chain_edits(edits) if edits else None, allow_disruptive, runtime)
        except ApplyError as exc:
            raise refused(exc) from None
        ignored = sorted(key for key in body if key not in ("mode", "log-level", "mixed-port"))
        if ignored:
            log.debug("PATCH /configs ignored keys honk does not apply: %s", ", ".join(ignored))
        return no_content()

    async def put_configs(request: web.Request) -> web.StreamResponse:
        # dashboards send force=true on every reload: it is accepted and is no consent to disruption
        allow_disruptive = request.query.get("allow_disruptive", "").lower() in ("true", "1", "yes")
        body = await json_body(request, empty_ok=True)
        path, payload = body.get("path") or "", body.get("payload") or ""
        if payload or (path and not _same_file(path, control)):
            raise bad_request(OWN_FILE_ONLY, "reload_only")
        try:
            await control.reload(allow_disruptive)
        except ApplyError as exc:
            raise refused(exc) from None
        return no_content()

    # --- DNS -------------------------------------------------------------------------------------

    async def dns_query(request: web.Request) -> web.StreamResponse:
        service = control.dns_service
        if service is None:
            raise ApiError(500, "dns_disabled", DNS_DISABLED)
        import dns.flags
        import dns.message

        question = dns_question(
            request.query.get("name", ""), request.query.get("type") or DEFAULT_QTYPE
        ).to_wire()
        # as a client of the standalone listener: over UDP, again over TCP when the answer came
        # truncated; no intercepted destination, so an asis rule fails there as it does here
        answer = await service.handle(question, None, None)
        message = dns.message.from_wire(answer) if answer is not None else None
        if message is not None and message.flags & dns.flags.TC:
            answer = await service.handle(question, None, None, tcp=True)
            message = dns.message.from_wire(answer) if answer is not None else None
        if message is None:
            raise ApiError(500, "internal", "the DNS service dropped the query")
        return reply(dns_query_json(message))

    async def flush_dns_cache(request: web.Request) -> web.StreamResponse:
        service = control.dns_service
        if service is not None:
            dropped = service.cache.flush()
            log.info("dns cache flushed through the API (%d entries)", dropped)
        return no_content()

    # --- streams ---------------------------------------------------------------------------------

    async def traffic(request: web.Request) -> web.StreamResponse:
        return await streams.serve(request, streams.traffic_frames(control), control)

    async def memory(request: web.Request) -> web.StreamResponse:
        return await streams.serve(request, streams.memory_frames(control), control)

    async def logs(request: web.Request) -> web.StreamResponse:
        level = LOG_LEVELS.get(request.query.get("level", "info").lower())
        if level is None:
            raise bad_request("level must be one of debug, info, warning, error, silent")
        structured = request.query.get("format", "").lower() == "structured"
        formatter = (
            (lambda e: views.log_structured(e.wall, e.level, views.log_message(e)))
            if structured
            else (lambda e: views.log_plain(e.level, views.log_message(e)))
        )
        subscription = control.logs.subscribe(level)
        try:
            return await streams.serve_log_lines(request, control, subscription, formatter)
        finally:
            subscription.close()  # idempotent; a debug reader must not outlive its stream

    return [
        web.get("/version", version, allow_head=False),
        web.get("/proxies", get_proxies, allow_head=False),
        web.get("/proxies/{name}", get_proxy, allow_head=False),
        web.put("/proxies/{name}", put_proxy),
        web.delete("/proxies/{name}", delete_proxy),
        web.get("/proxies/{name}/delay", proxy_delay, allow_head=False),
        web.get("/group", get_groups, allow_head=False),
        web.get("/group/{name}", get_group, allow_head=False),
        web.get("/group/{name}/delay", group_delay, allow_head=False),
        web.get("/providers/proxies", get_providers, allow_head=False),
        web.get("/providers/proxies/{provider}", get_provider, allow_head=False),
        web.put("/providers/proxies/{provider}", put_provider),
        web.get("/providers/proxies/{provider}/healthcheck", provider_healthcheck, allow_head=False),
        web.get(
            "/providers/proxies/{provider}/{name}/healthcheck", provider_node_healthcheck, allow_head=False
        ),
        web.get("/rules", get_rules, allow_head=False),
        web.patch("/rules/disable", patch_rules_disable),
        web.get("/providers/rules", get_rule_providers, allow_head=False),
        web.get("/connections", get_connections, allow_head=False),
        web.delete("/connections", delete_connections),
        web.delete("/connections/{id}", delete_connection),
        web.get("/stats", get_stats, allow_head=False),
        web.get("/configs", get_configs, allow_head=False),
        web.patch("/configs", patch_configs),
        web.put("/configs", put_configs),
        web.get("/traffic", traffic, allow_head=False),
        web.get("/memory", memory, allow_head=False),
        web.get("/logs", logs, allow_head=False),
        web.get("/dns/query", dns_query, allow_head=False),
        web.post("/cache/dns/flush", flush_dns_cache),
    ]


def _same_file(path: str, control: Control) -> bool:
    try:
        return Path(path).resolve() == Path(control.config_path).resolve()
    except OSError:
        return False


def with_log_level(level: str):  # noqa: ANN201 - Spec -> Spec
    """The running configuration's log level (a reload of the file sets it back)."""

    def edit(spec: Spec) -> Spec:
        return dataclasses.replace(spec, global_=dataclasses.replace(spec.global_, log_level=level))

    return edit


def chain_edits(edits):  # noqa: ANN001, ANN201 - [Spec -> Spec] -> (Spec -> Spec)
    def edit(spec: Spec) -> Spec:
        for one in edits:
            spec = one(spec)
        return spec

    return edit


def with_mixed_port(port: int):  # noqa: ANN201 - Spec -> Spec
    """The edit ``mixed-port`` asks for: the first mixed inbound moves to ``port`` (a bind
    change: its sessions stay), 0 removes it (its sessions close), and without one a
    ``mixed`` inbound on loopback is added."""

    def edit(spec: Spec) -> Spec:
        inbounds = list(spec.inbounds)
        index = next((i for i, inbound in enumerate(inbounds) if inbound.kind == "mixed"), None)
        if index is None:
            if port:
                inbounds.append(InboundSpec(name="mixed", kind="mixed", host="127.0.0.1", port=port))
        elif port:
            inbounds[index] = dataclasses.replace(inbounds[index], port=port)
        else:
            del inbounds[index]
        return dataclasses.replace(spec, inbounds=tuple(inbounds))

    return edit
