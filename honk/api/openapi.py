"""The OpenAPI 3.1 document of the native ``/v1`` API, served at ``/v1/openapi.json``.

Built as a plain dict from the same constants the handlers use; a unit test
checks that every route :func:`honk.api.native.routes` registers is described
here and that nothing else is.
"""

from __future__ import annotations

from typing import Any

from honk import __version__
from honk.api.delay import DEFAULT_DELAY_TIMEOUT, MAX_DELAY_TIMEOUT
from honk.api.native import CONFIG_FORMATS, DEFAULT_CONFIG_FORMAT, FALSE_WORDS, PREFIX, TRUE_WORDS
from honk.api.native_views import API_VERSION, HISTORY_ENTRIES
from honk.api.streams import NDJSON as LINES_TYPE
from honk.control.errors import refusal_kinds
from honk.core.logs import LEVELS
from honk.group.score.ranker import CANDIDATE_COUNTERS, FINAL_REASONS

OPENAPI_VERSION = "3.1.0"
JSON_TYPE = "application/json"

Schema = dict[str, Any]

# Every stable error code with its HTTP status (the contract's list).
ERROR_CODES: dict[str, int] = {
    "unauthorized": 401,
    "resource_not_found": 404,
    "group_not_found": 404,
    "node_not_found": 404,
    "member_not_found": 400,
    "not_a_selector": 400,
    "connection_not_found": 404,
    "invalid_request": 400,
    "body_too_large": 413,
    "not_running": 503,
    "filter_required": 400,
    "internal": 500,
    "config_invalid": 422,
    "geodata_update_failed": 422,
    "geodata_update_running": 409,
    # a refused apply: "reload_" + the ApplyError's variant, with its status
    **{f"reload_{variant}": status for variant, status in refusal_kinds().items()},
}


def _ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def _obj(properties: dict[str, Schema], required: list[str] | None = None, **extra: Any) -> Schema:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties) if required is None else required,
        **extra,
    }


STRING: Schema = {"type": "string"}
NULLABLE_STRING: Schema = {"type": ["string", "null"]}
INTEGER: Schema = {"type": "integer", "minimum": 0}
TIME: Schema = {"type": "string", "format": "date-time", "description": "RFC 3339 UTC with milliseconds"}
MS: Schema = {"type": "number", "description": "milliseconds, 3 decimals"}
NULLABLE_MS: Schema = {"type": ["number", "null"], "description": "milliseconds, 3 decimals"}
NETWORKS_ENUM = ["tcp", "udp"]
NETWORK_CHOICE: Schema = {"type": "string", "enum": ["tcp", "udp", "both"], "default": "both"}


def _per_network(item: Schema) -> Schema:
    return _obj({"tcp": item, "udp": item})


def schemas() -> dict[str, Schema]:
    link = _obj(
        {
            "status": {"type": "string", "enum": ["unknown", "alive", "dead"]},
            "average_ms": NULLABLE_MS,
            "history": {
                "type": "array",
                "maxItems": HISTORY_ENTRIES,
                "items": _obj({"time": TIME, "delay_ms": MS, "failed": {"type": "boolean"}}),
            },
        }
    )
    families = _obj(
        {"v4": _ref("Link"), "v6": _ref("Link")},
        required=[],
        description="only the address families that have a state",
    )
    diag = _obj(
        {
            "severity": {"type": "string", "enum": ["error", "warning", "info"]},
            "code": STRING,
            "key_path": STRING,
            "line": {"type": ["integer", "null"]},
            "column": {"type": ["integer", "null"]},
            "message": STRING,
        }
    )
    return {
        "Error": _obj(
            {
                "error": _obj(
                    {
                        "code": {"type": "string", "enum": list(ERROR_CODES)},
                        "message": STRING,
                    }
                )
            }
        ),
        "ConfigInvalid": _obj(
            {
                "error": _obj({"code": {"const": "config_invalid"}, "message": STRING}),
                "diagnostics": {"type": "array", "items": _ref("Diag")},
            }
        ),
        "Version": _obj(
            {
                "version": STRING,
                "api": {"type": "integer", "const": API_VERSION},
                "pid": {"type": "integer"},
                "started_at": TIME,
                "uptime_s": {"type": "number"},
            }
        ),
        "Status": _obj(
            {
                "version": STRING,
                "uptime_s": {"type": "number"},
                "generation": {"type": "integer"},
                "mode": {"type": "string", "enum": ["rule", "global", "direct"]},
                "connections": _obj({"tcp": INTEGER, "udp": INTEGER}),
                "traffic": _obj({"up": INTEGER, "down": INTEGER}),
                "nodes": _obj({"total": INTEGER, "alive": INTEGER}),
                "groups": INTEGER,
                "api": _obj({"address": NULLABLE_STRING}),
            }
        ),
        "Group": _obj(
            {
                "name": STRING,
                "id": {"type": "string", "format": "uuid"},
                "policy": {
                    "type": "string",
                    "enum": ["selector", "urltest", "loadbalance", "fallback", "score"],
                },
                "members": {"type": "array", "items": STRING},
                "leaves": {"type": "array", "items": STRING},
                "selection": _per_network(NULLABLE_STRING),
                "chain": _per_network(
                    {
                        "type": "array",
                        "items": STRING,
                        "description": "group, ..., leaf; [] when nothing resolves",
                    }
                ),
                "choice": {
                    "oneOf": [_per_network(NULLABLE_STRING), {"type": "null"}],
                    "description": "Selector groups: the effective choice; null otherwise",
                },
                "pinned": {
                    "oneOf": [_per_network(NULLABLE_STRING), {"type": "null"}],
                    "description": "URLTest and Fallback groups: the runtime pins; null otherwise",
                },
                "check_url": NULLABLE_STRING,
                "interrupt_connections": {"type": "boolean"},
            }
        ),
        "Link": link,
        "Node": _obj(
            {
                "name": STRING,
                "id": {"type": ["string", "null"], "format": "uuid"},
                "protocol": STRING,
                "server": {"type": ["string", "null"], "description": "host:port; null for direct and block"},
                "subscription": NULLABLE_STRING,
                "udp": {"type": "boolean"},
                "demoted": {"type": "boolean"},
                "health": _obj(
                    {"tcp": families, "dns_udp": families, "data_udp": families},
                    required=[],
                    description="only the domains that have a state; {} for direct and block",
                ),
                "latency": _obj(
                    {
                        "last_ms": NULLABLE_MS,
                        "history": {"type": "array", "items": _obj({"time": TIME, "delay_ms": MS})},
                    }
                ),
            }
        ),
        "DelayResult": _obj(
            {
                "delay_ms": NULLABLE_MS,
                "error": {"type": "string", "description": "empty on success; timeout, or <stage>:<reason>"},
            }
        ),
        "Conn": _obj(
            {
                "id": STRING,
                "network": {"type": "string", "enum": NETWORKS_ENUM},
                "inbound": STRING,
                "source": {"type": "string", "description": "ip:port"},
                "target": {"type": "string", "description": "host:port"},
                "rule": STRING,
                "chain": {"type": "array", "items": STRING, "description": "rule target, ..., leaf"},
                "upload": INTEGER,
                "download": INTEGER,
                "start": TIME,
                "engine": STRING,
                "outbound_version": {
                    "type": "string",
                    "description": "tag@vN: the outbound version the flow was opened on",
                },
                "user": {"type": "string", "description": "the inbound user, empty without one"},
            }
        ),
        "Diag": diag,
        "GeodataUpdate": _obj(
            {
                "ok": {"type": "boolean"},
                "assets": {
                    "type": "array",
                    "items": _obj(
                        {
                            "name": {"type": "string", "enum": ["geosite", "geoip"]},
                            "status": {"type": "string", "enum": ["updated", "unchanged", "failed"]},
                            "file": {
                                **NULLABLE_STRING,
                                "description": "the file replaced, compared with, or kept",
                            },
                            "bytes": {"type": ["integer", "null"], "description": "the downloaded size"},
                            "codes": {
                                "type": ["integer", "null"],
                                "description": "lists the downloaded file holds",
                            },
                            "sha256": NULLABLE_STRING,
                            "verified": {"type": "boolean", "description": "a published .sha256sum matched"},
                            "reason": {**NULLABLE_STRING, "description": "why a file failed; never the URL"},
                        }
                    ),
                },
                "reloaded": {"type": "boolean"},
                "generation": {"type": ["integer", "null"]},
                "reload_error": NULLABLE_STRING,
            },
            required=["ok", "assets", "reloaded", "generation", "reload_error"],
        ),
        "ScoreStats": _obj(
            {
                "groups": {
                    "type": "array",
                    "description": "one entry per (Score group, network) that has "
                    "counted anything, by group then network",
                    "items": _obj(
                        {
                            "group": STRING,
                            "network": {"type": "string", "enum": NETWORKS_ENUM},
                            "reasons": _obj(
                                {reason: INTEGER for reason in FINAL_REASONS},
                                description="applied multi-candidate ranks by final reason",
                            ),
                            "candidates": _obj(
                                {counter: INTEGER for counter in CANDIDATE_COUNTERS},
                                description="candidates affected, not flows",
                            ),
                            "ordinarySwitch": INTEGER,
                            "switchFlap": INTEGER,
                            "coldAllowance": INTEGER,
                            "coldSpent": INTEGER,
                        }
                    ),
                },
                "cache": _obj(
                    {
                        field: INTEGER
                        for field in (
                            "exactEntries",
                            "exactCapacity",
                            "exactEvictions",
                            "aggregateEntries",
                            "aggregateCapacity",
                            "aggregateEvictions",
                        )
                    },
                    description="evidence cache totals",
                ),
            },
            description="no node, target or cell identity (GH-K-130)",
        ),
    }


# --- operations ------------------------------------------------------------------------------


def _json(schema: Schema) -> Schema:
    return {"content": {JSON_TYPE: {"schema": schema}}}


def _ok(description: str, schema: Schema) -> Schema:
    return {"description": description, **_json(schema)}


def _errors(*codes: str) -> dict[str, Schema]:
    """Error responses by status for ``codes``, plus the ones every route can give."""
    by_status: dict[int, list[str]] = {}
    for code in (*codes, "unauthorized", "internal"):
        by_status.setdefault(ERROR_CODES[code], []).append(code)
    return {
        str(status): {"description": "error codes: " + ", ".join(names), **_json(_ref("Error"))}
        for status, names in sorted(by_status.items())
    }


def _path_param(name: str, description: str) -> Schema:
    return {"name": name, "in": "path", "required": True, "schema": STRING, "description": description}


def _query(name: str, schema: Schema, description: str) -> Schema:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def _op(
    operation_id: str,
    summary: str,
    responses: dict[str, Schema],
    *,
    parameters: list[Schema] | None = None,
    body: Schema | None = None,
) -> Schema:
    op: Schema = {"operationId": operation_id, "summary": summary, "responses": responses}
    if parameters:
        op["parameters"] = parameters
    if body is not None:
        op["requestBody"] = body
    return op


GROUP_NAME = _path_param("name", "the group's name (percent-encoded in the URL)")
NODE_NAME = _path_param("name", "the node's name (percent-encoded in the URL)")
BOOLEAN_WORD: Schema = {"type": "string", "enum": [*TRUE_WORDS, *FALSE_WORDS]}


def paths() -> dict[str, dict[str, Schema]]:
    selection_result = _obj(
        {
            "group": STRING,
            "member": STRING,
            "network": NETWORK_CHOICE,
            "changed": {"type": "array", "items": {"type": "string", "enum": NETWORKS_ENUM}},
        }
    )
    closed = _obj({"closed": INTEGER})
    return {
        f"{PREFIX}/version": {
            "get": _op(
                "getVersion",
                "Version, process id and uptime",
                {"200": _ok("the running honk", _ref("Version")), **_errors()},
            )
        },
        f"{PREFIX}/status": {
            "get": _op(
                "getStatus",
                "One-screen summary: generation, mode, connections, traffic, nodes",
                {"200": _ok("the summary", _ref("Status")), **_errors("not_running")},
            )
        },
        f"{PREFIX}/groups": {
            "get": _op(
                "listGroups",
                "Every group in configuration order",
                {
                    "200": _ok("the groups", _obj({"groups": {"type": "array", "items": _ref("Group")}})),
                    **_errors("not_running"),
                },
            )
        },
        f"{PREFIX}/groups/{{name}}": {
            "get": _op(
                "getGroup",
                "One group",
                {"200": _ok("the group", _ref("Group")), **_errors("group_not_found", "not_running")},
                parameters=[GROUP_NAME],
            )
        },
        f"{PREFIX}/groups/{{name}}/selection": {
            "put": _op(
                "putSelection",
                "Select a member: a Selector's choice, or a runtime pin of a URLTest or Fallback group; "
                "both networks are written all or nothing",
                {
                    "200": _ok("what changed", selection_result),
                    **_errors(
                        "invalid_request",
                        "member_not_found",
                        "not_a_selector",
                        "group_not_found",
                        "body_too_large",
                        "not_running",
                    ),
                },
                parameters=[GROUP_NAME],
                body={
                    "required": True,
                    **_json(_obj({"member": STRING, "network": NETWORK_CHOICE}, required=["member"])),
                },
            ),
            "delete": _op(
                "deleteSelection",
                "Remove the runtime pin of a URLTest or Fallback group",
                {
                    "200": _ok(
                        "the networks whose pin was removed",
                        _obj(
                            {
                                "group": STRING,
                                "cleared": {
                                    "type": "array",
                                    "items": {"type": "string", "enum": NETWORKS_ENUM},
                                },
                            }
                        ),
                    ),
                    **_errors("invalid_request", "not_a_selector", "group_not_found", "not_running"),
                },
                parameters=[
                    GROUP_NAME,
                    _query("network", NETWORK_CHOICE, "which network's pin (default both)"),
                ],
            ),
        },
        f"{PREFIX}/stats/score": {
            "get": _op(
                "getScoreStats",
                "Score's counters per group and network, and its evidence cache totals "
                "(the /stats.score document); reading ranks nothing",
                {"200": _ok("the counters", _ref("ScoreStats")), **_errors("not_running")},
            )
        },
        f"{PREFIX}/nodes": {
            "get": _op(
                "listNodes",
                "Every outbound (direct and block first) with its health",
                {
                    "200": _ok("the nodes", _obj({"nodes": {"type": "array", "items": _ref("Node")}})),
                    **_errors("not_running"),
                },
            )
        },
        f"{PREFIX}/nodes/{{name}}": {
            "get": _op(
                "getNode",
                "One node with its health",
                {"200": _ok("the node", _ref("Node")), **_errors("node_not_found", "not_running")},
                parameters=[NODE_NAME],
            )
        },
        f"{PREFIX}/delay": {
            "post": _op(
                "postDelay",
                "Measure an HTTP URL through a node, or through every member of a group",
                {
                    "200": _ok(
                        "one result per node or member",
                        _obj(
                            {
                                "target": STRING,
                                "url": STRING,
                                "kind": {"type": "string", "enum": ["node", "group"]},
                                "results": {"type": "object", "additionalProperties": _ref("DelayResult")},
                            }
                        ),
                    ),
                    **_errors("invalid_request", "node_not_found", "body_too_large", "not_running"),
                },
                body={
                    "required": True,
                    **_json(
                        _obj(
                            {
                                "target": STRING,
                                "url": {"type": "string", "default": "https://www.gstatic.com/generate_204"},
                                "timeout_ms": {
                                    "type": "integer",
                                    "minimum": 1,
                                    "maximum": int(MAX_DELAY_TIMEOUT * 1000),
                                    "default": int(DEFAULT_DELAY_TIMEOUT * 1000),
                                },
                            },
                            required=["target"],
                        )
                    ),
                },
            )
        },
        f"{PREFIX}/connections": {
            "get": _op(
                "listConnections",
                "Live connections and the bytes relayed since start",
                {
                    "200": _ok(
                        "the connections",
                        _obj(
                            {
                                "connections": {"type": "array", "items": _ref("Conn")},
                                "totals": _obj({"up": INTEGER, "down": INTEGER}),
                            }
                        ),
                    ),
                    **_errors(),
                },
            ),
            "delete": _op(
                "closeConnections",
                "Close the connections through a group, on a node, or all; exactly one filter",
                {
                    "200": _ok("how many were closed", closed),
                    **_errors(
                        "filter_required",
                        "invalid_request",
                        "group_not_found",
                        "node_not_found",
                        "not_running",
                    ),
                },
                parameters=[
                    _query("group", STRING, "close the flows whose chain passes through this group"),
                    _query("node", STRING, "close the flows whose leaf is this node"),
                    _query("all", BOOLEAN_WORD, "true: close every flow"),
                ],
            ),
        },
        f"{PREFIX}/connections/{{id}}": {
            "delete": _op(
                "closeConnection",
                "Close one connection",
                {"200": _ok("closed", closed), **_errors("connection_not_found")},
                parameters=[_path_param("id", "the connection's id")],
            )
        },
        f"{PREFIX}/reload": {
            "post": _op(
                "postReload",
                "Apply the configuration file as it is now",
                {
                    "200": _ok(
                        "the apply report: what was built, swapped, drained, rebound, restarted, removed "
                        "and reused, and the plane epoch",
                        _obj(
                            {
                                "applied": {"type": "boolean"},
                                "generation": {"type": "integer"},
                                "epoch": {"type": "integer"},
                                "summary": {"type": "string"},
                                **{
                                    field: {"type": "array", "items": {"type": "string"}}
                                    for field in (
                                        "built",
                                        "swapped",
                                        "drained",
                                        "rebound",
                                        "restarted",
                                        "removed",
                                        "reused",
                                    )
                                },
                            }
                        ),
                    ),
                    **_errors("invalid_request", *(c for c in ERROR_CODES if c.startswith("reload_"))),
                },
                parameters=[
                    _query(
                        "allow_disruptive",
                        BOOLEAN_WORD,
                        "apply even a change that ends live connections (a transparent "
                        "inbound's interception)",
                    )
                ],
            )
        },
        f"{PREFIX}/geodata/update": {
            "post": _op(
                "postGeodataUpdate",
                "Download the configured geodata (assets.geodata), check it against the "
                "running rules, swap it in atomically and reload when a file changed",
                {
                    "200": _ok("every asked file updated or unchanged", _ref("GeodataUpdate")),
                    "422": {
                        "description": "error code: geodata_update_failed; the body also holds the per-file "
                        "report (a failed file kept its old content)",
                        **_json(_ref("GeodataUpdate")),
                    },
                    **_errors("invalid_request", "geodata_update_running"),
                },
                parameters=[
                    _query(
                        "name",
                        {"type": "string", "enum": ["geosite", "geoip"]},
                        "only this asset (repeatable); default: both",
                    )
                ],
            )
        },
        f"{PREFIX}/users/{{set}}": {
            "put": _op(
                "putUsers",
                "Replace every user of an inbound's user set (the set is named like the inbound)",
                {
                    "200": _ok(
                        "the set's users now",
                        _obj({"user_set": STRING, "users": {"type": "array", "items": STRING}}),
                    ),
                    **_errors("invalid_request", "reload_invalid"),
                },
                parameters=[_path_param("set", "the user set: an inbound with users")],
                body={
                    "required": True,
                    **_json(
                        _obj(
                            {
                                "users": {
                                    "type": "array",
                                    "items": _obj({"username": STRING, "password": STRING}),
                                }
                            }
                        )
                    ),
                },
            )
        },
        f"{PREFIX}/users/{{set}}/{{user}}": {
            "put": _op(
                "putUser",
                "Add a user to a user set, or change the user's password",
                {
                    "200": _ok("done", _obj({"user_set": STRING, "user": STRING})),
                    **_errors("invalid_request", "reload_invalid"),
                },
                parameters=[_path_param("set", "the user set"), _path_param("user", "the user's name")],
                body={"required": True, **_json(_obj({"password": STRING}))},
            ),
            "delete": _op(
                "deleteUser",
                "Remove a user from a user set; its sessions follow user_removal",
                {
                    "200": _ok(
                        "whether the user was there",
                        _obj({"user_set": STRING, "user": STRING, "removed": {"type": "boolean"}}),
                    ),
                    **_errors("reload_invalid"),
                },
                parameters=[_path_param("set", "the user set"), _path_param("user", "the user's name")],
            ),
        },
        f"{PREFIX}/config/check": {
            "post": _op(
                "postConfigCheck",
                "Validate a configuration text without applying it",
                {
                    "200": _ok(
                        "valid, with its warnings",
                        _obj(
                            {
                                "ok": {"const": True},
                                "summary": STRING,
                                "diagnostics": {"type": "array", "items": _ref("Diag")},
                            }
                        ),
                    ),
                    "422": {"description": "error code: config_invalid", **_json(_ref("ConfigInvalid"))},
                    **_errors("invalid_request", "body_too_large"),
                },
                parameters=[
                    _query(
                        "format",
                        {"type": "string", "enum": list(CONFIG_FORMATS), "default": DEFAULT_CONFIG_FORMAT},
                        "the dialect of the body; relative includes resolve from the running file's directory",
                    )
                ],
                body={"required": True, "content": {"text/plain": {"schema": STRING}}},
            )
        },
        f"{PREFIX}/logs": {
            "get": _op(
                "streamLogs",
                "Live log lines as NDJSON until the client disconnects",
                {
                    "200": {
                        "description": "chunked: one JSON object per line (NDJSON)",
                        "content": {
                            LINES_TYPE: {
                                "schema": _obj(
                                    {
                                        "time": TIME,
                                        "level": {
                                            "type": "string",
                                            "enum": ["debug", "info", "warning", "error"],
                                        },
                                        "logger": STRING,
                                        "message": STRING,
                                    }
                                )
                            }
                        },
                    },
                    **_errors("invalid_request"),
                },
                parameters=[
                    _query(
                        "level",
                        {"type": "string", "enum": list(LEVELS), "default": "info"},
                        "the lowest level streamed",
                    )
                ],
            )
        },
        f"{PREFIX}/openapi.json": {
            "get": _op(
                "getOpenApi",
                "This document",
                {"200": _ok("the OpenAPI 3.1 document", {"type": "object"}), **_errors()},
            )
        },
    }


def document() -> dict[str, Any]:
    """The whole OpenAPI 3.1 document."""
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "honk native API",
            "version": f"{API_VERSION}",
            "description": f"honk {__version__}: groups, nodes, connections, reload and config checks. "
            "Documented for people in docs/api.md.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths(),
        "components": {
            "schemas": schemas(),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "the clash_api secret"}
            },
        },
    }
