"""The native ``/v1`` API: JSON for ``honkctl`` and scripts (contract: docs/api.md).

Reads go to the owner of the data through :mod:`honk.api.native_views`; every
write goes through the daemon's serialized writer (``select``, ``pin``,
``reload``), so an acknowledged write landed in the manager that is published.
Errors are :class:`~honk.api.errors.ApiError` with a stable code; the server's
error middleware renders them as ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path
from typing import Any

from aiohttp import web

from honk import __version__
from honk.alive.checkurl import DEFAULT_DELAY_URL, parse_check_url
from honk.api import native_views as views
from honk.api.context import Control, running_plane
from honk.api.delay import DEFAULT_DELAY_TIMEOUT, DelayResult, test_group, test_leaf, timeout_from_ms
from honk.api.errors import ApiError
from honk.api.errors import refused as apply_refused
from honk.api.jsonio import dumps, encode_each, reply, stream_json
from honk.api.streams import serve_log_lines
from honk.config.diagnostics import ConfigError
from honk.config.spec import InboundUser, Policy
from honk.control.errors import ApplyError
from honk.core.logs import LEVELS, LogEvent
from honk.core.net import Network
from honk.group.policy import UnknownGroup, UnknownMember

PREFIX = "/v1"
CONFIG_FORMATS = ("dae", "toml", "json")
DEFAULT_CONFIG_FORMAT = "dae"
CLOSE_WAIT = 5.0  # seconds a close request waits for its flows to end before answering anyway
TRUE_WORDS = ("true", "1")
FALSE_WORDS = ("false", "0")
GEODATA_FAILED_STATUS = 422  # a geodata update with a file not updated, or whose reload was refused


# --- request helpers -------------------------------------------------------------------------


def invalid(message: str) -> ApiError:
    return ApiError(400, "invalid_request", message)


async def json_object(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object; 400 invalid_request otherwise."""
    raw = await request.read()
    try:
        body = json.loads(raw.decode("utf-8")) if raw.strip() else None
    except (UnicodeDecodeError, ValueError):
        raise invalid("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise invalid("the body must be a JSON object")
    return body


def string_field(body: dict[str, Any], name: str, *, required: bool) -> str | None:
    value = body.get(name)
    if value is None:
        if required:
            raise invalid(f"{name} is required")
        return None
    if not isinstance(value, str) or not value:
        raise invalid(f"{name} must be a non-empty string")
    return value


def network_of(value: object, name: str) -> Network | None:
    """``tcp``, ``udp`` or ``both`` (None, the default)."""
    if value is None or value == "both":
        return None
    if value in ("tcp", "udp"):
        return Network(value)
    raise invalid(f"{name} must be tcp, udp or both")


def flag(request: web.Request, name: str) -> bool:
    value = request.query.get(name)
    if value is None:
        return False
    if value.lower() in TRUE_WORDS:
        return True
    if value.lower() in FALSE_WORDS:
        return False
    raise invalid(f"{name} must be true or false")


def network_text(network: Network | None) -> str:
    return "both" if network is None else network.value


def group_not_found(name: str) -> ApiError:
    return ApiError(404, "group_not_found", f"no group named {name!r}")


def node_not_found(name: str) -> ApiError:
    return ApiError(404, "node_not_found", f"no node named {name!r}")


def not_a_selector(name: str, why: str) -> ApiError:
    return ApiError(400, "not_a_selector", f"group {name!r} {why}")


# --- the routes ------------------------------------------------------------------------------


def routes(control: Control) -> list[web.RouteDef]:
    """Every ``/v1`` endpoint, closing over ``control``."""

    async def version(request: web.Request) -> web.StreamResponse:
        uptime = control.clock.now() - control.started_at
        return reply(views.version_view(__version__, os.getpid(), control.started_wall, uptime))

    async def status(request: web.Request) -> web.StreamResponse:
        plane = running_plane(control)
        bound = control.api.bound if control.api is not None else None
        address = f"{bound[0]}:{bound[1]}" if bound else None
        return reply(
            views.status_view(
                version=__version__,
                uptime=control.clock.now() - control.started_at,
                generation=control.generation,
                mode=control.mode.mode,
                plane=plane,
                alive=control.health.alive,
                flows=control.tracker.snapshot(),
                totals=control.tracker.totals(),
                address=address,
            )
        )

    # --- groups --------------------------------------------------------------------------

    async def list_groups(request: web.Request) -> web.StreamResponse:
        return reply({"groups": views.groups_view(running_plane(control))})

    async def get_group(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        plane = running_plane(control)
        if name not in plane.groups:
            raise group_not_found(name)
        return reply(views.group_view(plane, name))

    def policy_of(name: str) -> Policy:
        """The configured policy (a Score group is ``score`` here, whatever runs it today)."""
        plane = running_plane(control)
        if name not in plane.groups:
            raise group_not_found(name)
        return views.group_specs(plane.spec)[name].policy

    def refused(name: str) -> ApiError:
        """The writer refused the group: gone (a reload removed it) or not writable this way."""
        if name in running_plane(control).groups:
            return not_a_selector(name, "cannot take this selection")
        return group_not_found(name)

    async def put_selection(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        body = await json_object(request)
        member = string_field(body, "member", required=True)
        assert member is not None
        network = network_of(body.get("network"), "network")
        kind = policy_of(name)
        try:
            if kind is Policy.SELECTOR:
                changed = await control.select(name, member, network)
            elif kind in views.FIXABLE_POLICIES:
                changed = await control.pin(name, member, network)
            else:
                raise not_a_selector(name, f"is a {kind.value} group; it takes no selection")
        except UnknownMember:
            raise ApiError(400, "member_not_found", f"{member!r} is not a member of group {name!r}") from None
        except UnknownGroup:
            raise refused(name) from None
        return reply(
            {
                "group": name,
                "member": member,
                "network": network_text(network),
                "changed": [net.value for net in changed],
            }
        )

    async def delete_selection(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        network = network_of(request.query.get("network"), "network")
        kind = policy_of(name)
        if kind not in views.FIXABLE_POLICIES:
            raise not_a_selector(
                name, f"is a {kind.value} group; only urltest and fallback groups are pinned"
            )
        try:
            cleared = await control.pin(name, None, network)
        except UnknownGroup:
            raise refused(name) from None
        return reply({"group": name, "cleared": [net.value for net in cleared]})

    # --- Score statistics ----------------------------------------------------------------------

    async def score_stats(request: web.Request) -> web.StreamResponse:
        """``/stats.score``: counters only; reading it ranks nothing (GH-K-129)."""
        return reply(views.score_view(running_plane(control)))

    # --- nodes and delay tests -------------------------------------------------------------

    async def list_nodes(request: web.Request) -> web.StreamResponse:
        plane, alive = running_plane(control), control.health.alive
        specs = views.node_specs(plane.spec)
        nodes = await encode_each(
            plane.outbounds, lambda name: dumps(views.node_view(plane, alive, name, specs))
        )
        return await stream_json(request, '{"nodes":[', nodes, "]}")

    async def get_node(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        plane = running_plane(control)
        if name not in plane.outbounds:
            raise node_not_found(name)
        return reply(views.node_view(plane, control.health.alive, name))

    async def delay(request: web.Request) -> web.StreamResponse:
        body = await json_object(request)
        target = string_field(body, "target", required=True)
        assert target is not None
        url = string_field(body, "url", required=False) or DEFAULT_DELAY_URL
        try:
            parse_check_url(url, default_scheme="https")
        except ValueError as exc:
            raise invalid(f"url is not a usable URL ({exc})") from None
        timeout = timeout_from_ms(body.get("timeout_ms", int(DEFAULT_DELAY_TIMEOUT * 1000)), "timeout_ms")
        plane = running_plane(control)
        results: dict[str, DelayResult]
        if target in plane.outbounds:  # a node or builtin first, as the Clash API's leaf lookup does
            kind = "node"
            results = {target: await test_leaf(control, plane.outbounds[target], url, timeout)}
        elif target in plane.groups:
            kind = "group"
            results = await test_group(control, target, url, timeout)
        else:
            raise ApiError(404, "node_not_found", f"no node or group named {target!r}")
        return reply(
            {
                "target": target,
                "url": url,
                "kind": kind,
                "results": {
                    name: {"delay_ms": views.millis(r.delay), "error": r.error} for name, r in results.items()
                },
            }
        )

    # --- connections -------------------------------------------------------------------------

    async def list_connections(request: web.Request) -> web.StreamResponse:
        up, down = control.tracker.totals()
        return reply(
            {
                "connections": [views.conn_view(info) for info in control.tracker.snapshot()],
                "totals": {"up": up, "down": down},
            }
        )

    async def close(ids: list[str]) -> int:
        """Ask each flow to end, then wait (bounded) until they have, so a list right after
        the answer no longer shows them."""
        asked = await control.close_flows(ids, "closed by the API")
        if asked:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(control.tracker.wait_gone(asked), CLOSE_WAIT)
        return len(asked)

    async def close_one(request: web.Request) -> web.StreamResponse:
        flow_id = request.match_info["id"]
        if control.tracker.get(flow_id) is None:
            raise ApiError(404, "connection_not_found", f"no connection with id {flow_id!r}")
        return reply({"closed": await close([flow_id])})

    async def close_many(request: web.Request) -> web.StreamResponse:
        group = request.query.get("group")
        node = request.query.get("node")
        everything = flag(request, "all")
        given = [
            what
            for what, present in (
                ("group", group is not None),
                ("node", node is not None),
                ("all", everything),
            )
            if present
        ]
        if not given:
            raise ApiError(400, "filter_required", "give one of group=, node= or all=true")
        if len(given) > 1:
            raise invalid(f"give only one of group=, node= or all=true (got {', '.join(given)})")
        flows = control.tracker.snapshot()
        if group is not None:
            chosen = views.flows_through_group(flows, group)
            # a group a reload removed may still carry flows: only an unknown name with none is an error
            if not chosen and group not in running_plane(control).groups:
                raise group_not_found(group)
        elif node is not None:
            chosen = views.flows_on_node(flows, node)
            if not chosen and node not in running_plane(control).outbounds:
                raise node_not_found(node)
        else:
            chosen = flows
        return reply({"closed": await close([info.id for info in chosen])})

    # --- reload and config check -------------------------------------------------------------

    async def reload(request: web.Request) -> web.StreamResponse:
        try:
            report = await control.reload(flag(request, "allow_disruptive"))
        except ApplyError as exc:
            raise apply_refused(exc) from None
        return reply({"applied": True, "generation": control.generation, **report.to_json()})

    async def check_config(request: web.Request) -> web.StreamResponse:
        fmt = request.query.get("format", DEFAULT_CONFIG_FORMAT).lower()
        if fmt not in CONFIG_FORMATS:
            raise invalid(f"format must be one of {', '.join(CONFIG_FORMATS)}")
        raw = await request.read()
        try:
            text = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise invalid("the body is not UTF-8 text") from None
        base_dir = Path(control.config_path).resolve().parent  # relative includes: as the running file's
        return reply(*await check_text(control, text, fmt, str(base_dir)))

    # --- geodata ------------------------------------------------------------------------------

    async def update_geodata(request: web.Request) -> web.StreamResponse:
        from honk.control.geoupdate import ASSETS, UpdateBusy

        names = request.query.getall("name", [])
        unknown = [n for n in names if n not in ASSETS]
        if unknown or set(request.query) - {"name"}:
            raise invalid(f"name must be one of {', '.join(ASSETS)}")
        try:
            report = await control.update_geodata(list(dict.fromkeys(names)) or None)
        except UpdateBusy as exc:
            raise ApiError(409, "geodata_update_running", str(exc)) from None
        if report.ok:
            return reply(report.to_json())
        failed = [a.name for a in report.assets if a.status == "failed"]
        message = f"{', '.join(failed)}: not updated" if failed else f"reload refused: {report.reload_error}"
        return reply(
            {"error": {"code": "geodata_update_failed", "message": message}, **report.to_json()},
            status=GEODATA_FAILED_STATUS,
        )

    # --- users ----------------------------------------------------------------------------------

    def user_of(name: str, body: dict[str, Any]) -> InboundUser:
        password = string_field(body, "password", required=True)
        assert password is not None
        if not name or not password:
            raise invalid("a user needs a name and a password")
        return InboundUser(name, password)

    async def edit_users(run) -> Any:  # noqa: ANN001 - awaitable factory
        try:
            return await run()
        except ApplyError as exc:
            raise apply_refused(exc) from None

    async def put_users(request: web.Request) -> web.StreamResponse:
        user_set = request.match_info["set"]
        body = await json_object(request)
        listed = body.get("users")
        if not isinstance(listed, list) or not all(isinstance(u, dict) for u in listed):
            raise invalid("users must be a list of {username, password} objects")
        users = [user_of(str(u.get("username") or ""), u) for u in listed]
        await edit_users(lambda: control.set_users(user_set, users))
        return reply({"user_set": user_set, "users": [u.username for u in users]})

    async def put_user(request: web.Request) -> web.StreamResponse:
        user_set, name = request.match_info["set"], request.match_info["user"]
        user = user_of(name, await json_object(request))
        await edit_users(lambda: control.upsert_user(user_set, user))
        return reply({"user_set": user_set, "user": name})

    async def delete_user(request: web.Request) -> web.StreamResponse:
        user_set, name = request.match_info["set"], request.match_info["user"]
        removed = await edit_users(lambda: control.remove_user(user_set, name))
        return reply({"user_set": user_set, "user": name, "removed": removed})

    # --- logs ----------------------------------------------------------------------------------

    async def logs(request: web.Request) -> web.StreamResponse:
        level = request.query.get("level", "info").lower()
        if level not in LEVELS:
            raise invalid(f"level must be one of {', '.join(LEVELS)}")
        subscription = control.logs.subscribe(level)
        try:
            return await serve_log_lines(request, control, subscription, log_line)
        finally:
            subscription.close()  # idempotent; covers a stream that ended before its first line

    async def openapi(request: web.Request) -> web.StreamResponse:
        from honk.api.openapi import document

        return reply(document())

    return [
        web.get(f"{PREFIX}/version", version, allow_head=False),
        web.get(f"{PREFIX}/status", status, allow_head=False),
        web.get(f"{PREFIX}/groups", list_groups, allow_head=False),
        web.get(f"{PREFIX}/groups/{{name}}", get_group, allow_head=False),
        web.put(f"{PREFIX}/groups/{{name}}/selection", put_selection),
        web.delete(f"{PREFIX}/groups/{{name}}/selection", delete_selection),
        web.get(f"{PREFIX}/stats/score", score_stats, allow_head=False),
        web.get(f"{PREFIX}/nodes", list_nodes, allow_head=False),
        web.get(f"{PREFIX}/nodes/{{name}}", get_node, allow_head=False),
        web.post(f"{PREFIX}/delay", delay),
        web.get(f"{PREFIX}/connections", list_connections, allow_head=False),
        web.delete(f"{PREFIX}/connections", close_many),
        web.delete(f"{PREFIX}/connections/{{id}}", close_one),
        web.post(f"{PREFIX}/reload", reload),
        web.post(f"{PREFIX}/geodata/update", update_geodata),
        web.put(f"{PREFIX}/users/{{set}}", put_users),
        web.put(f"{PREFIX}/users/{{set}}/{{user}}", put_user),
        web.delete(f"{PREFIX}/users/{{set}}/{{user}}", delete_user),
        web.post(f"{PREFIX}/config/check", check_config),
        web.get(f"{PREFIX}/logs", logs, allow_head=False),
        web.get(f"{PREFIX}/openapi.json", openapi, allow_head=False),
    ]


async def check_text(control: Control, text: str, fmt: str, base_dir: str) -> tuple[dict[str, Any], int]:
    """Validate a configuration text as ``honk check`` does: load it, then the daemon's dry run
    (plan from empty, prepare binding nothing). (body, status): 200 or 422 config_invalid."""
    from honk.config.load import load_text, summary

    try:
        # parsing is pure work on the text (and any included files): off the event loop
        spec = await asyncio.to_thread(load_text, text, fmt, source="<posted>", base_dir=base_dir)
        await control.check_spec(spec, Path(base_dir) / "posted")
    except ConfigError as exc:
        errors = len(exc.errors)
        return (
            {
                "error": {"code": "config_invalid", "message": f"the configuration has {errors} error(s)"},
                "diagnostics": [views.diag_view(d) for d in exc.diagnostics],
            },
            422,
        )
    except ApplyError as exc:  # loads, but a start would refuse it (a rule, a handler, a reference)
        return (
            {
                "error": {"code": "config_invalid", "message": str(exc)},
                "diagnostics": [
                    {
                        "severity": "error",
                        "code": exc.variant,
                        "key_path": "",
                        "line": None,
                        "column": None,
                        "message": str(exc),
                    }
                ],
            },
            422,
        )
    return (
        {"ok": True, "summary": summary(spec), "diagnostics": [views.diag_view(d) for d in spec.diagnostics]},
        200,
    )


def log_line(event: LogEvent) -> dict[str, Any]:
    return {
        "time": views.rfc3339(event.wall),
        "level": event.level,
        "logger": event.logger,
        "message": event.message,
    }
