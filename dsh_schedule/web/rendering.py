"""How the console's pages and their live parts are rendered.

Pages are rendered on the server from Jinja templates with autoescaping on: every text a
person or a model wrote reaches the browser as text, never as markup. Live parts of a
page are server-sent events whose data are fragments rendered by the same templates: a
stream looks at the logs every ``POLL_S``, sends a fragment when the log changed, and
every fragment again at least every ``REFRESH_S``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.instant import MAX_MS, MIN_MS, format_instant, parse_instant
from dsh_schedule.web import model
from dsh_schedule.web.console import Console

HERE: Final = Path(__file__).resolve().parent
TEMPLATES: Final = HERE / "templates"
STATIC: Final = HERE / "static"
FAVICON: Final = (STATIC / "favicon.svg").read_bytes()

POLL_S: Final = 0.2  # how often a live stream looks at the logs
REFRESH_S: Final = 5.0  # a live stream re-sends its fragments at least this often
_LINE_BREAK: Final = re.compile(r"\r\n|\r|\n")


def template_environment() -> jinja2.Environment:
    """The templates, with autoescaping on for every template (never ``|safe`` on what a
    person or a model wrote)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["urlpart"] = lambda text: quote(str(text), safe="")
    env.filters["clock"] = lambda ms, zone=None: model.local_text(int(ms), zone)
    env.filters["instant"] = _instant
    env.filters["epoch_ms"] = parse_instant
    env.filters["seconds"] = _seconds
    return env


def _instant(ms: int) -> str:
    return format_instant(min(max(int(ms), MIN_MS), MAX_MS))


def _seconds(ms: float | None) -> str:
    if ms is None:
        return "—"
    return f"{ms / 1000:.2f} s" if abs(ms) < 10_000 else f"{ms / 1000:.0f} s"


def sse(event: str, data: str) -> str:
    """One server-sent event; each line of ``data`` is a ``data:`` line (the browser
    joins them with line feeds)."""
    lines = "".join(f"data: {line}\n" for line in _LINE_BREAK.split(data))
    return f"event: {event}\n{lines}\n"


def stream_routes(app: FastAPI, console: Console, render: Callable[..., str]) -> None:
    """``GET /stream/sessions`` (the sessions table) and ``GET /stream/session/{id}`` (a
    session's transcript, receipts and reminders)."""

    async def in_thread(function: Callable[..., Any], *args: Any) -> Any:
        return await run_in_threadpool(function, *args)

    @app.get("/stream/sessions")
    async def stream_sessions(request: Request) -> StreamingResponse:
        async def events() -> AsyncIterator[str]:
            last: Any = None
            since = 0.0
            yield "retry: 1000\n\n"
            while not console.closing:
                signature = await in_thread(console.signature)
                if signature != last or since >= REFRESH_S:
                    last, since = signature, 0.0
                    summaries = await in_thread(console.summaries)
                    yield sse("sessions", render("_sessions_table.html", summaries=summaries))
                if await request.is_disconnected():
                    return
                await asyncio.sleep(POLL_S)
                since += POLL_S

        return _stream(events())

    # -- one session ------------------------------------------------------------------

    @app.get("/stream/session/{session_id:path}", response_model=None)
    async def stream_session(session_id: str, request: Request) -> Response:
        if not console.exists(session_id):
            return PlainTextResponse("no such session", status_code=404)

        async def events() -> AsyncIterator[str]:
            last = -1
            since = 0.0
            yield "retry: 1000\n\n"
            while not console.closing:
                try:
                    length = await in_thread(console.length, session_id)
                    view = (await in_thread(console.session_page, session_id)
                            if length != last or since >= REFRESH_S else None)
                except (PersistenceError, ScheduleLogError):
                    view = None  # the page said why; look again at the next poll
                if view is not None:
                    if length != last:
                        yield sse("transcript", render("_transcript.html", page=view))
                        yield sse("receipts", render("_receipts.html", page=view))
                    yield sse("reminders", render("_reminders.html", page=view))
                    last, since = length, 0.0
                if await request.is_disconnected():
                    return
                await asyncio.sleep(POLL_S)
                since += POLL_S

        return _stream(events())


def _stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
