"""The documents hold together: every ``docs/architecture.md#…`` a comment or document
cites is a heading there, links between the documents land on headings, the repository
cites nothing outside itself, and the sample log of docs/architecture.md#time means what
the document says it means."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from dsh_schedule.shared.core.errors import ToolError
from dsh_schedule.shared.core.events import USER_MESSAGE, Event, Session, SessionHeader
from dsh_schedule.shared.core.fold import fold
from dsh_schedule.shared.core.presentation import reminder_presentation
from dsh_schedule.shared.core.timecontext import derive_zone_context, implicit_zone

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
ARCHITECTURE = DOCS / "architecture.md"
# Folders that are not the project's own text; os.walk does not follow the top-level links
# into dsh_schedule/, so every file is read once.
SKIPPED_DIRS = frozenset({
    ".venv", ".git", "build", "dist", "__pycache__", ".mypy_cache", ".ruff_cache",
    ".hypothesis", ".pytest_cache", ".import_linter_cache",
})
CITED = re.compile(r"docs/architecture\.md#([A-Za-z0-9_-]+)")
MD_LINK = re.compile(r"\]\(([^)\s]*)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
# Citations of documents outside the repository, written in pieces so that this file
# does not contain what it forbids. The requirements' nickname is matched in lower case
# (and, in any case, where it can only name a document), so a test may still begin a
# sentence about its random seed with it.
OUTSIDE_CITATIONS = (
    re.compile(re.escape("DESIGN " + "§")),
    re.compile(r"\bthe " + "seed" + r"\b"),
    re.compile(r"\bthe " + "seed" + r"(?:'s|\s+(?:document|file|says))\b", re.IGNORECASE),
)


def project_files(*suffixes: str) -> Iterator[Path]:
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info"))
        for name in sorted(files):
            if name.endswith(suffixes):
                yield Path(folder) / name


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: link targets kept as their text, lower case,
    punctuation other than ``-`` and ``_`` dropped, spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file (repeated headings get ``-1``, ``-2``…)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        match = None if in_fence else HEADING.match(line)
        if match is None:
            continue
        anchor = github_anchor(match.group(2))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


def prose(path: Path) -> Iterator[str]:
    """The lines of a Markdown file outside fenced blocks, without inline code spans."""
    in_fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence:
            yield re.sub(r"`[^`]*`", "", line)


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_every_cited_architecture_anchor_is_a_heading() -> None:
    # given every heading anchor of docs/architecture.md
    known = anchors(ARCHITECTURE)

    # when every Python and Markdown file of the repository is searched for citations
    cited: dict[str, set[str]] = {}
    for path in project_files(".py", ".md"):
        for anchor in CITED.findall(path.read_text(encoding="utf-8")):
            cited.setdefault(anchor, set()).add(relative(path))

    # then there are citations, and each names a heading that exists
    assert cited, "no file cites docs/architecture.md"
    missing = {anchor: sorted(paths) for anchor, paths in cited.items() if anchor not in known}
    assert not missing, f"cited anchors with no heading in docs/architecture.md: {missing}"


def test_links_between_the_documents_land_on_headings() -> None:
    # given the Markdown files of the repository and the links they hold
    broken: list[str] = []
    for path in project_files(".md"):
        for target in (t for line in prose(path) for t in MD_LINK.findall(line)):
            if "://" in target or target.startswith("mailto:"):
                continue
            file_part, _, anchor = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            # when a link names a file of the repository (and maybe a heading in it)
            if not linked.exists():
                broken.append(f"{relative(path)}: {target} (no such file)")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
                broken.append(f"{relative(path)}: {target} (no such heading)")

    # then every one of them exists
    assert not broken, "\n".join(broken)


def test_the_repository_cites_nothing_outside_itself() -> None:
    # when every Python and Markdown file is searched for citations of outside documents
    offenders = [
        f"{relative(path)}:{number}: {line.strip()}"
        for path in project_files(".py", ".md")
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(pattern.search(line) for pattern in OUTSIDE_CITATIONS)
    ]

    # then there is none: the project explains itself
    assert not offenders, "\n".join(offenders)


def sample_session() -> Session:
    """The sample log of docs/architecture.md#host-event-vocabulary, as a session."""
    blocks = re.findall(r"```jsonl\n(.*?)```", ARCHITECTURE.read_text(encoding="utf-8"), re.S)
    assert len(blocks) == 1, "docs/architecture.md holds exactly one sample log"
    header_line, *event_lines = blocks[0].strip().splitlines()
    header = msgspec.convert(json.loads(header_line), SessionHeader)
    events = [msgspec.convert(json.loads(line), Event) for line in event_lines]
    assert [e.seq for e in events] == list(range(len(events)))
    return Session(header=header, events=events)


def test_the_sample_log_confirms_the_zone_of_its_local_time() -> None:
    # given the sample log as it stood when the model called schedule_create (after the
    # first step/start)
    session = sample_session()
    call = next(i for i, e in enumerate(session.events) if e.type == "step/start") + 1
    at_call = Session(header=session.header, events=session.events[:call])

    # when the zone of a local time without time_zone is derived from it
    zone = implicit_zone(derive_zone_context(at_call))

    # then it is the session's zone
    assert zone == session.header.timeZone == "Europe/Berlin"


@pytest.mark.parametrize("drop_reading", [True, False])
def test_the_sample_log_without_its_confirmation_requires_one(drop_reading: bool) -> None:
    # given the sample log at the call, without the reading or with another client zone
    session = sample_session()
    call = next(i for i, e in enumerate(session.events) if e.type == "step/start") + 1
    events = list(session.events[:call])
    if drop_reading:
        events = [e for e in events if e.data.get("source", {}).get("kind") != "plugin"]
    else:
        person = next(e for e in events if e.type == USER_MESSAGE)
        source = dict(person.data["source"], clientTimeZone="Europe/Lisbon")
        events[person.seq] = msgspec.structs.replace(person, data={**person.data,
                                                                   "source": source})
    events = [msgspec.structs.replace(e, seq=i) for i, e in enumerate(events)]

    # when the zone is derived, then confirmation is required, as the document says
    with pytest.raises(ToolError) as raised:
        implicit_zone(derive_zone_context(Session(header=session.header, events=events)))
    value = raised.value.value()
    assert value["code"] == "timezone_confirmation_required"
    assert value["sessionTimeZone"] == "Europe/Berlin"
    assert value["clientTimeZones"] == ([] if drop_reading else ["Europe/Lisbon"])


def test_the_sample_log_replays_and_its_delivery_names_its_dispatch() -> None:
    # given the whole sample log
    session = sample_session()

    # when it is folded, and its dispatch presented
    state = fold(session.events, session.seed_length)
    dispatch = next(
        e for e in session.events
        if e.type == "schedule/change" and e.data["operation"] == "dispatch"
    )
    shown = reminder_presentation(session.events, dispatch.seq, session.seed_length)

    # then nothing is left active, and the delivered message covers exactly that dispatch
    assert state.active == ()
    assert shown is not None
    delivered = [
        e.data["source"]["reminders"] for e in session.events
        if e.type == USER_MESSAGE and e.data["source"].get("plugin") == "tool-schedule"
    ]
    assert delivered == [[{"scheduleId": shown.scheduleId, "occurrenceAt": shown.occurrenceAt}]]
    assert shown.occurrenceAt == "2026-12-01T16:00:00.000Z"
