"""The tool catalog: defined once, generated into docs, exported to two tool formats."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsh_schedule.shared.core.catalog import (
    CATALOG_PATH,
    ERROR_WHEN,
    REGENERATE_COMMAND,
    TOOL_NAMES,
    anthropic_tools,
    catalog_json,
    openai_tools,
    tool_definitions,
)
from dsh_schedule.shared.core.catalogdoc import render_catalog_markdown
from dsh_schedule.shared.core.errors import ERROR_CODES, V1_ERROR_CODES, ToolError
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.shared.core.records import AfterSchedule, AtSchedule, EverySchedule, Schedule
from dsh_schedule.shared.core.views import delete_value, list_value, schedule_view

REPO = Path(__file__).resolve().parents[2]

# The draft 2020-12 keywords the catalog may use, and what each value must be.
_KEYWORDS: dict[str, type | tuple[type, ...]] = {
    "type": str,
    "properties": dict,
    "required": list,
    "additionalProperties": bool,
    "minProperties": int,
    "maxProperties": int,
    "items": dict,
    "uniqueItems": bool,
    "enum": list,
    "const": (str, bool, int),
    "pattern": str,
    "minLength": int,
    "minimum": int,
    "maximum": int,
    "oneOf": list,
    "$ref": str,
    "$defs": dict,
    "description": str,
}
_TYPES = {"object", "array", "string", "integer", "number", "boolean", "null"}


def _schema_nodes(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield schema
    for key in ("properties", "$defs"):
        for child in schema.get(key, {}).values():
            yield from _schema_nodes(child)
    for child in schema.get("oneOf", []):
        yield from _schema_nodes(child)
    if "items" in schema:
        yield from _schema_nodes(schema["items"])


def _resolve(root: dict[str, Any], ref: str) -> dict[str, Any]:
    assert ref.startswith("#/$defs/"), ref
    resolved: dict[str, Any] = root["$defs"][ref.removeprefix("#/$defs/")]
    return resolved


def _type_ok(instance: Any, kind: str) -> bool:
    checks = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        # JSON Schema counts 600.0 as an integer, never true.
        "integer": lambda v: (
            not isinstance(v, bool)
            and (isinstance(v, int) or (isinstance(v, float) and v.is_integer()))
        ),
        "boolean": lambda v: isinstance(v, bool),
    }
    return bool(checks[kind](instance))


def _valid(instance: Any, schema: dict[str, Any], root: dict[str, Any]) -> bool:
    """A small draft 2020-12 validator for exactly the keywords in ``_KEYWORDS``."""
    if "$ref" in schema and not _valid(instance, _resolve(root, schema["$ref"]), root):
        return False
    if "oneOf" in schema and sum(_valid(instance, s, root) for s in schema["oneOf"]) != 1:
        return False
    if "type" in schema and not _type_ok(instance, schema["type"]):
        return False
    if "const" in schema and (
        type(instance) is not type(schema["const"]) or instance != schema["const"]
    ):
        return False
    if "enum" in schema and instance not in schema["enum"]:
        return False
    if isinstance(instance, str):
        if len(instance) < schema.get("minLength", 0):
            return False
        if "pattern" in schema and re.search(schema["pattern"], instance) is None:
            return False
    if isinstance(instance, int | float) and not isinstance(instance, bool):
        if not schema.get("minimum", instance) <= instance <= schema.get("maximum", instance):
            return False
    if isinstance(instance, list):
        if schema.get("uniqueItems") and len(set(map(repr, instance))) != len(instance):
            return False
        if "items" in schema and not all(_valid(i, schema["items"], root) for i in instance):
            return False
    if isinstance(instance, dict):
        return _valid_object(instance, schema, root)
    return True


def _valid_object(instance: dict[str, Any], schema: dict[str, Any], root: dict[str, Any]) -> bool:
    properties = schema.get("properties", {})
    if any(key not in instance for key in schema.get("required", [])):
        return False
    if schema.get("additionalProperties") is False and set(instance) - set(properties):
        return False
    if not schema.get("minProperties", 0) <= len(instance) <= schema.get("maxProperties", 99):
        return False
    return all(_valid(v, properties[k], root) for k, v in instance.items() if k in properties)


def _tool(name: str) -> dict[str, Any]:
    return next(t for t in catalog_json() if t["name"] == name)


def test_the_committed_catalog_is_current() -> None:
    committed = (REPO / CATALOG_PATH).read_text(encoding="utf-8")
    assert committed == render_catalog_markdown(), (
        f"{CATALOG_PATH} is stale; regenerate it with `{REGENERATE_COMMAND}`"
    )


def test_running_the_module_prints_the_catalog() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "dsh_schedule.shared.core.catalog"],
        cwd=REPO,
        capture_output=True,
        check=True,
        encoding="utf-8",
    ).stdout
    assert printed == render_catalog_markdown()


def test_every_tool_appears_once_in_every_export_in_catalog_order() -> None:
    assert [t.name for t in tool_definitions()] == list(TOOL_NAMES)
    assert [t["name"] for t in catalog_json()] == list(TOOL_NAMES)
    assert [t["function"]["name"] for t in openai_tools()] == list(TOOL_NAMES)
    assert [t["name"] for t in anthropic_tools()] == list(TOOL_NAMES)


def test_exporters_have_their_format_shapes() -> None:
    definitions = {t.name: t for t in tool_definitions()}
    for entry in catalog_json():
        assert list(entry) == ["name", "description", "inputSchema", "outputSchema"]
    for entry in openai_tools():
        assert list(entry) == ["type", "function"] and entry["type"] == "function"
        function = entry["function"]
        assert list(function) == ["name", "description", "parameters"]
        assert function["parameters"] == definitions[function["name"]].input_schema
    for entry in anthropic_tools():
        assert list(entry) == ["name", "description", "input_schema"]
        assert entry["input_schema"] == definitions[entry["name"]].input_schema


def test_exports_are_fresh_copies() -> None:
    tools = catalog_json()
    tools[0]["inputSchema"]["properties"].clear()
    assert catalog_json()[0]["inputSchema"]["properties"]


@pytest.mark.parametrize("name", TOOL_NAMES)
def test_argument_schemas_suit_every_tool_format(name: str) -> None:
    schema = _tool(name)["inputSchema"]
    # a top-level object, with no top-level combinator and no references to resolve
    assert schema["type"] == "object"
    assert not {"oneOf", "anyOf", "allOf", "$defs", "$ref"} & set(schema)
    assert "$ref" not in repr(schema)


@pytest.mark.parametrize(("name", "part"), [(n, p) for n in TOOL_NAMES for p in ("in", "out")])
def test_schemas_are_structurally_valid(name: str, part: str) -> None:
    root = _tool(name)["inputSchema" if part == "in" else "outputSchema"]
    for node in _schema_nodes(root):
        for key, value in node.items():
            assert key in _KEYWORDS, key
            assert isinstance(value, _KEYWORDS[key]), (key, value)
        if "type" in node:
            assert node["type"] in _TYPES
        if "pattern" in node:
            re.compile(node["pattern"])
        if "$ref" in node:
            _resolve(root, node["$ref"])
        if node.get("type") == "object":
            assert node["additionalProperties"] is False
            assert set(node["required"]) <= set(node["properties"])


@pytest.mark.parametrize(
    "args",
    [
        pytest.param({"prompt": "p", "after_seconds": 600}, id="after_seconds"),
        pytest.param({"prompt": "p", "after_seconds": 600.0}, id="an integral float"),
        pytest.param({"prompt": "p", "every_seconds": 300}, id="every_seconds at the floor"),
        pytest.param({"prompt": "p", "at": "2026-12-01T16:00:00Z"}, id="at with Z"),
        pytest.param({"prompt": "p", "at": "2026-12-01T17:00:00.5+01:00"}, id="at with offset"),
        pytest.param({"prompt": "p", "at": "2026-12-01T16:00:00.123-03:30"}, id="negative"),
        pytest.param({"prompt": "p", "at": {"date": "2026-12-01", "time": "16:00:00"}}, id="local"),
        pytest.param(
            {
                "prompt": "p",
                "at": {"date": "2026-12-01", "time": "16:00:00.25", "time_zone": "UTC"},
            },
            id="local with a zone",
        ),
    ],
)
def test_valid_create_arguments_match_the_schema(args: dict[str, Any]) -> None:
    schema = _tool("schedule_create")["inputSchema"]
    assert _valid(args, schema, schema)


@pytest.mark.parametrize(
    "args",
    [
        pytest.param({"prompt": "p"}, id="no selector"),
        pytest.param({"prompt": "p", "after_seconds": 1, "every_seconds": 300}, id="two selectors"),
        pytest.param({"prompt": "p", "cron": "* * * * *"}, id="an unknown key"),
        pytest.param({"after_seconds": 600}, id="no prompt"),
        pytest.param({"prompt": "", "after_seconds": 600}, id="an empty prompt"),
        pytest.param({"prompt": "p", "after_seconds": 0}, id="after_seconds not positive"),
        pytest.param({"prompt": "p", "after_seconds": 2**53}, id="after_seconds not safe"),
        pytest.param({"prompt": "p", "after_seconds": True}, id="true is not an integer"),
        pytest.param({"prompt": "p", "after_seconds": 1.5}, id="a fraction"),
        pytest.param({"prompt": "p", "every_seconds": 299}, id="every_seconds below 300"),
        pytest.param({"prompt": "p", "at": "0000-12-01T16:00:00Z"}, id="year 0000"),
        pytest.param({"prompt": "p", "at": "2026-12-01T24:00:00Z"}, id="hour 24"),
        pytest.param({"prompt": "p", "at": "2026-12-01T16:00:60Z"}, id="second 60"),
        pytest.param({"prompt": "p", "at": "2026-12-01t16:00:00Z"}, id="lowercase t"),
        pytest.param({"prompt": "p", "at": "2026-12-01T16:00:00z"}, id="lowercase z"),
        pytest.param({"prompt": "p", "at": "2026-12-01 16:00:00Z"}, id="a space"),
        pytest.param({"prompt": "p", "at": "2026-12-01T16:00:00-00:00"}, id="-00:00"),
        pytest.param({"prompt": "p", "at": "2026-12-01T16:00:00+24:00"}, id="offset hour 24"),
        pytest.param({"prompt": "p", "at": "2026-12-01T16:00:00.1234Z"}, id="four fractions"),
        pytest.param({"prompt": "p", "at": "2026-12-01T16:00:00"}, id="no offset"),
        pytest.param(
            {"prompt": "p", "at": {"date": "2026-12-01", "time": "16:00", "x": 1}}, id="extra key"
        ),
        pytest.param({"prompt": "p", "at": {"date": "2026-12-01"}}, id="no time"),
        pytest.param(
            {"prompt": "p", "at": {"date": "2026-12-01", "time": 9}}, id="time not a string"
        ),
    ],
)
def test_invalid_create_arguments_do_not_match_the_schema(args: dict[str, Any]) -> None:
    schema = _tool("schedule_create")["inputSchema"]
    assert not _valid(args, schema, schema)


@pytest.mark.parametrize(
    ("name", "args", "valid"),
    [
        pytest.param("schedule_list", {}, True, id="list takes nothing"),
        pytest.param("schedule_list", {"all": True}, False, id="list takes no keys"),
        pytest.param("schedule_delete", {"id": "schedule-1"}, True, id="delete takes an id"),
        pytest.param("schedule_delete", {"id": ""}, False, id="an empty id"),
        pytest.param("schedule_delete", {}, False, id="no id"),
        pytest.param("schedule_delete", {"id": 1}, False, id="a non-string id"),
    ],
)
def test_list_and_delete_arguments(name: str, args: dict[str, Any], valid: bool) -> None:
    schema = _tool(name)["inputSchema"]
    assert _valid(args, schema, schema) is valid


RECORDS: tuple[Schedule, ...] = (
    AfterSchedule(
        id="schedule-1", prompt="a", afterSeconds=60, scheduledAt="2026-12-01T09:01:00.000Z"
    ),
    AtSchedule(id="schedule-2", prompt="b", scheduledAt="2026-12-01T16:00:00.000Z"),
    EverySchedule(
        id="schedule-3", prompt="c", everySeconds=300, scheduledAt="2026-12-01T09:00:00.000Z"
    ),
)
GATED = FoldState(
    active=RECORDS,
    created=frozenset(r.id for r in RECORDS),
    last_batch_ms=parse_instant("2026-12-01T08:58:00.000Z"),
)
NOW = parse_instant("2026-12-01T09:02:00.000Z")
ERRORS = (
    ToolError("invalid_rule"),
    ToolError("persistence_uncertain", operation="delete", id="schedule-1"),
    ToolError("timezone_confirmation_required", sessionTimeZone="unavailable", clientTimeZones=[]),
)


def test_the_views_match_the_create_and_list_output_schemas() -> None:
    # given one view of each kind, one of them held back by the recurring gate
    views = list_value(GATED, NOW)
    assert "deliveryNotBefore" in views[2]
    create, listing = (_tool(n)["outputSchema"] for n in ("schedule_create", "schedule_list"))
    # then each view is a create result and the whole list is a list result
    assert all(_valid(v, create, create) for v in views)
    assert _valid(views, listing, listing)
    assert not _valid({**views[1], "afterSeconds": 5}, create, create)


@pytest.mark.parametrize("name", TOOL_NAMES)
def test_error_values_match_every_output_schema(name: str) -> None:
    schema = _tool(name)["outputSchema"]
    assert all(_valid(err.value(), schema, schema) for err in ERRORS)
    assert not _valid({"code": "schedule_not_found", "message": "m"}, schema, schema)
    # without the lifecycle, the eleven version-1 codes (limit_exceeded is the lifecycle's)
    assert schema["$defs"]["error"]["properties"]["code"]["enum"] == list(V1_ERROR_CODES)


@pytest.mark.parametrize("deleted", [True, False])
def test_delete_values_match_the_delete_output_schema(deleted: bool) -> None:
    schema = _tool("schedule_delete")["outputSchema"]
    assert _valid(delete_value("schedule-1", deleted), schema, schema)
    assert not _valid(schedule_view(RECORDS[0], GATED, NOW), schema, schema)


@pytest.mark.parametrize(
    ("name", "phrases"),
    [
        pytest.param(
            "schedule_create",
            ("session-local", "300", "time_zone", "timezone_confirmation_required", "future"),
            id="create names delivery, the floor and the zone rule",
        ),
        pytest.param("schedule_list", ("session-local", "deliveryNotBefore", "300"), id="list"),
        pytest.param("schedule_delete", ("schedule_not_found",), id="delete"),
    ],
)
def test_descriptions_tell_the_model_the_rules(name: str, phrases: tuple[str, ...]) -> None:
    description = _tool(name)["description"]
    assert all(phrase in description for phrase in phrases)


def test_the_error_table_has_one_row_per_closed_code() -> None:
    assert list(ERROR_WHEN) == list(ERROR_CODES)
    rows = [line for line in render_catalog_markdown().splitlines() if line.startswith("| `")]
    assert [row.split("`")[1] for row in rows] == list(ERROR_CODES)
