"""The OpenAPI document describes exactly the native routes, and its references resolve."""

from __future__ import annotations

import json
import re
from typing import Any

from honk.api import native
from honk.api.openapi import ERROR_CODES, OPENAPI_VERSION, document

METHODS = {"get", "put", "post", "delete", "patch", "head", "options"}


class _NoControl:
    """routes() only closes over its control; building the list reads nothing from it."""


def registered() -> set[tuple[str, str]]:
    return {(route.method.lower(), route.path) for route in native.routes(_NoControl())}  # type: ignore[arg-type]


def described(doc: dict[str, Any]) -> set[tuple[str, str]]:
    return {(method, path) for path, item in doc["paths"].items() for method in item if method in METHODS}


def refs(node: object) -> list[str]:
    if isinstance(node, dict):
        found = [node["$ref"]] if "$ref" in node else []
        return found + [r for value in node.values() for r in refs(value)]
    if isinstance(node, list):
        return [r for value in node for r in refs(value)]
    return []


def test_every_registered_route_is_described_and_nothing_else():
    doc = document()
    assert registered() == described(doc)
    assert len(registered()) == 21  # 16, the three user edits, the Score statistics, and geodata update


def test_the_document_is_openapi_3_1_and_serializes_to_json():
    doc = document()
    assert doc["openapi"] == OPENAPI_VERSION and OPENAPI_VERSION.startswith("3.1")
    assert json.loads(json.dumps(doc)) == doc


def test_every_reference_points_at_a_defined_schema():
    doc = document()
    schemas = doc["components"]["schemas"]
    targets = refs(doc)
    assert targets  # the document does use references
    for ref in targets:
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.rsplit("/", 1)[1] in schemas, ref


def test_every_path_placeholder_has_a_required_path_parameter_and_no_other():
    for path, item in document()["paths"].items():
        placeholders = set(re.findall(r"\{([^}]+)\}", path))
        for method, op in item.items():
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == placeholders, (method, path)
            assert all(p["required"] for p in op.get("parameters", []) if p["in"] == "path")


def test_every_operation_has_a_success_response_and_documents_unauthorized():
    for path, item in document()["paths"].items():
        for method, op in item.items():
            statuses = set(op["responses"])
            assert "200" in statuses, (method, path)
            assert "401" in statuses, (method, path)
            assert op["operationId"]


def test_the_error_schema_lists_every_stable_code_with_its_status():
    doc = document()
    codes = doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"]
    assert set(codes) == set(ERROR_CODES)
    assert ERROR_CODES["config_invalid"] == 422 and ERROR_CODES["body_too_large"] == 413
    check = doc["paths"]["/v1/config/check"]["post"]["responses"]
    assert check["422"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ConfigInvalid"
    }


def test_writes_with_a_body_describe_it():
    paths = document()["paths"]
    selection = paths["/v1/groups/{name}/selection"]["put"]["requestBody"]["content"]["application/json"][
        "schema"
    ]
    assert selection["required"] == ["member"]
    assert selection["properties"]["network"]["enum"] == ["tcp", "udp", "both"]
    delay = paths["/v1/delay"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert delay["properties"]["timeout_ms"]["maximum"] == 32767
    assert "text/plain" in paths["/v1/config/check"]["post"]["requestBody"]["content"]
