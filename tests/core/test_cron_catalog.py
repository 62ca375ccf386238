"""The catalog with and without calendar rules (docs/decisions.md#calendar-rules): disabled,
every export is the one without them; enabled, ``schedule_create`` gains ``cron`` and the
views a ``cron`` view, and docs/tool-catalog.md shows that variant."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from dsh_schedule.shared.core.catalog import (
    CALENDAR_SENTENCES,
    CREATE_DESCRIPTION,
    anthropic_tools,
    catalog_json,
    openai_tools,
)
from dsh_schedule.shared.core.catalogdoc import render_catalog_markdown
from dsh_schedule.shared.core.fold import FoldState
from dsh_schedule.shared.core.instant import parse_instant
from dsh_schedule.shared.core.records import CronSchedule, EverySchedule
from dsh_schedule.shared.core.views import list_value
from tests.core.test_catalog import _KEYWORDS, _schema_nodes, _valid


def _strip_calendar(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The enabled catalog with exactly the calendar additions taken out."""
    tools = copy.deepcopy(tools)
    create, listing = tools[0], tools[1]
    create["description"] = create["description"].removesuffix(CALENDAR_SENTENCES)
    del create["inputSchema"]["properties"]["cron"]
    for tool in (create, listing):
        defs = tool["outputSchema"]["$defs"]
        del defs["cronView"]
        defs["view"]["oneOf"].remove({"$ref": "#/$defs/cronView"})
    return tools


def test_disabled_is_the_enabled_catalog_without_its_calendar_additions() -> None:
    disabled, enabled = catalog_json(), catalog_json(calendar=True)
    assert json.dumps(disabled) == json.dumps(_strip_calendar(enabled))
    assert "cron" not in json.dumps(disabled)
    assert disabled[0]["description"] == CREATE_DESCRIPTION
    assert json.dumps(openai_tools()) != json.dumps(openai_tools(calendar=True))
    assert "cron" not in json.dumps([openai_tools(), anthropic_tools()])
    assert enabled[2] == disabled[2]  # delete is the same either way


def test_the_enabled_schemas_use_only_the_catalog_keywords() -> None:
    for tool in catalog_json(calendar=True):
        for root in (tool["inputSchema"], tool["outputSchema"]):
            for node in _schema_nodes(root):
                assert set(node) <= set(_KEYWORDS)
                if node.get("type") == "object":
                    assert node["additionalProperties"] is False


@pytest.mark.parametrize(
    ("args", "valid"),
    [
        ({"prompt": "p", "cron": "0 9 * * MON-FRI"}, True),
        ({"prompt": "p", "cron": {"expression": "0 9 * * MON-FRI"}}, True),
        ({"prompt": "p", "cron": {"expression": "0 9 * * 1-5", "time_zone": "Europe/Berlin"}},
         True),
        ({"prompt": "p", "cron": ""}, False),
        ({"prompt": "p", "cron": 5}, False),
        ({"prompt": "p", "cron": {"time_zone": "UTC"}}, False),
        ({"prompt": "p", "cron": {"expression": "0 9 * * *", "zone": "UTC"}}, False),
        ({"prompt": "p", "cron": "0 9 * * *", "every_seconds": 300}, False),
    ],
)
def test_cron_arguments_and_the_schemas(args: dict[str, Any], valid: bool) -> None:
    enabled = catalog_json(calendar=True)[0]["inputSchema"]
    disabled = catalog_json()[0]["inputSchema"]
    assert _valid(args, enabled, enabled) is valid
    assert not _valid(args, disabled, disabled)


def test_cron_views_match_the_enabled_output_schemas() -> None:
    records = (
        EverySchedule(id="schedule-1", prompt="c", everySeconds=300,
                      scheduledAt="2026-12-01T09:00:00.000Z"),
        CronSchedule(id="schedule-2", prompt="d", cron="0 9 * * MON-FRI", timeZone="UTC",
                     scheduledAt="2026-12-01T09:00:00.000Z"),
    )
    state = FoldState(active=records, created=frozenset({"schedule-1", "schedule-2"}),
                      last_batch_ms=parse_instant("2026-12-01T08:58:00.000Z"))
    views = list_value(state, parse_instant("2026-12-01T09:02:00.000Z"))
    assert "deliveryNotBefore" in views[1]
    create, listing = (t["outputSchema"] for t in catalog_json(calendar=True)[:2])
    assert all(_valid(v, create, create) for v in views)
    assert _valid(views, listing, listing)
    assert not _valid({**views[1], "everySeconds": 300}, create, create)
    old = catalog_json()[0]["outputSchema"]
    assert not _valid(views[1], old, old)


def test_the_catalog_document_shows_the_calendar_variant() -> None:
    text = render_catalog_markdown()
    section = text[text.index("## Calendar rules"):]
    enabled = catalog_json(calendar=True)[0]
    assert enabled["description"] in section
    assert json.dumps(enabled["inputSchema"], ensure_ascii=False, indent=2) in section
    assert json.dumps(enabled["outputSchema"]["$defs"]["cronView"], indent=2) in section
    assert "DSH_SCHEDULE_CALENDAR=on" in section
    # and what comes before it is the catalog without calendar rules
    assert "cron" not in text[:text.index("## Calendar rules")]
