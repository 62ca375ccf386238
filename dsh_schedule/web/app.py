"""The web console's pages, fragments and live streams (FastAPI).

Pages are rendered on the server from Jinja templates with autoescaping on: every text a
person or a model wrote reaches the browser as text, never as markup. Live parts of a
page are fed by server-sent events whose data are fragments rendered by the same
templates; the vendored script (``static/htmx.min.js``) posts the forms and polls the
operations figures, and ``static/console.js`` connects the streams, fills in the
browser's time zone and runs the countdowns.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, quote, urlsplit

import jinja2
import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError
from dsh_schedule.shared.core.instant import MAX_MS, MIN_MS, format_instant, parse_instant
from dsh_schedule.status import Status
from dsh_schedule.web import model
from dsh_schedule.web.access import (
    COOKIE,
    LOGIN_PATH,
    Access,
    AccessGuard,
    Asgi,
    LoginLimit,
    Scope,
    cookie_value,
    refused_without_token,
    token_matches,
)
from dsh_schedule.web.console import (
    Console,
    ConsoleError,
    create_call,
    delete_call,
    update_call,
)

HERE: Final = Path(__file__).resolve().parent
TEMPLATES: Final = HERE / "templates"
STATIC: Final = HERE / "static"

POLL_S: Final = 0.2  # how often a live stream looks at the logs
REFRESH_S: Final = 5.0  # a live stream re-sends its fragments at least this often
MAX_FORM_BYTES: Final = 64 * 1024
# The sessions page's filter of the active reminders: a local date and time, the browser's
# zone it is read in, and a text.
FILTER_FIELDS: Final = ("due_before", "zone", "q")
MAX_FILTER: Final = 200
_LINE_BREAK: Final = re.compile(r"\r\n|\r|\n")
ACKNOWLEDGEMENT: Final = "X-Acknowledgement"  # a form's answer, percent-encoded UTF-8
FAVICON: Final = (STATIC / "favicon.svg").read_bytes()


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


async def _form(request: Request) -> dict[str, str]:
    """An ``application/x-www-form-urlencoded`` body (what the console's forms post)."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise ConsoleError("the form is too large")
    try:
        fields = parse_qs(body.decode("utf-8"), keep_blank_values=True,
                          strict_parsing=False, max_num_fields=20)
    except (UnicodeDecodeError, ValueError):
        raise ConsoleError("the form could not be read") from None
    return {name: values[-1] for name, values in fields.items()}


def _same_origin(request: Request) -> bool:
    """A form post from a page of another site is refused: the console acts for whoever
    can reach it, so it takes input only from its own pages. Comparing ``Origin`` (or,
    without one, ``Referer``) with ``Host`` means something because ``AccessGuard`` has
    already refused every ``Host`` that names no address of the console (a rebound name
    sends matching ones). A post that names neither is a script's (curl, a Bearer token)
    unless it carries the sign-in cookie: a browser sent that, so it must say from where."""
    if request.headers.get("sec-fetch-site") == "cross-site":
        return False
    host = request.headers.get("host")
    origin = request.headers.get("origin")
    if origin is not None:
        return origin != "null" and urlsplit(origin).netloc == host
    referer = request.headers.get("referer")
    if referer is not None:
        return urlsplit(referer).netloc == host
    return COOKIE not in request.cookies


def create_app(console: Console, *, access: Access, port: int,
               login_limit: LoginLimit | None = None) -> FastAPI:
    """The console's app as served on ``port`` the way ``access`` says: every request,
    static files included, passes the Host check and (with a token) the token check
    first (docs/web.md#access); sign-in attempts are limited by ``login_limit`` (the
    default ``LoginLimit`` when None)."""
    app = FastAPI(title="dsh-schedule web console", docs_url=None, redoc_url=None,
                  openapi_url=None)
    env = template_environment()
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    def login_page(status_code: int, error: str | None = None) -> HTMLResponse:
        return HTMLResponse(env.get_template("login.html").render(error=error),
                            status_code=status_code, headers={
                                "Cache-Control": "no-store",
                                "WWW-Authenticate": 'Bearer realm="dsh-schedule web"',
                            } if status_code == 401 else {"Cache-Control": "no-store"})

    def unauthorized(scope: Scope) -> Asgi:
        """A page a browser asked for is answered with the sign-in form; anything else
        with one line."""
        accept = next((bytes(v).decode("latin-1") for k, v in scope.get("headers", [])
                       if bytes(k).lower() == b"accept"), "")
        if scope.get("method") == "GET" and "text/html" in accept:
            return login_page(401)
        return refused_without_token()

    app.add_middleware(AccessGuard, access=access, port=port, unauthorized=unauthorized)
    if access.token is not None:
        _login_routes(app, access.token, login_page, login_limit or LoginLimit())

    def render(name: str, **context: Any) -> str:
        return env.get_template(name).render(
            mode=console.mode, sessions_dir=str(console.settings.sessions),
            lifecycle=console.settings.lifecycle, **context
        )

    def page(name: str, status_code: int = 200, **context: Any) -> HTMLResponse:
        return HTMLResponse(render(name, **context), status_code=status_code,
                            headers={"Cache-Control": "no-store"})

    @app.exception_handler(PersistenceError)
    @app.exception_handler(ScheduleLogError)
    async def unreadable(request: Request, exc: Exception) -> HTMLResponse:
        """A log that cannot be read: say so, never show it as empty."""
        return page("problem.html", 500, nav="sessions", problem=str(exc))

    def refused() -> PlainTextResponse:
        return PlainTextResponse("refused: a form of another site", status_code=403)

    async def in_thread(function: Callable[..., Any], *args: Any) -> Any:
        return await run_in_threadpool(function, *args)

    # -- sessions ---------------------------------------------------------------------

    async def sessions_page(error: str | None = None, form_id: str = "",
                            form_zone: str = "", status_code: int = 200,
                            query: dict[str, str] | None = None) -> HTMLResponse:
        summaries = await in_thread(console.summaries)
        found = {key: (query or {}).get(key, "")[:MAX_FILTER] for key in FILTER_FIELDS}
        filter_error = None
        try:
            listing = await in_thread(console.reminders, found["due_before"], found["zone"],
                                      found["q"])
        except ConsoleError as exc:
            listing, filter_error, status_code = None, str(exc), 400
        return page("sessions.html", status_code, nav="sessions", summaries=summaries,
                    error=error, form_id=form_id, form_zone=form_zone, listing=listing,
                    filter=found, filter_error=filter_error)

    @app.get("/", response_class=HTMLResponse)
    async def index(request: Request) -> HTMLResponse:
        return await sessions_page(query=dict(request.query_params))

    @app.post("/sessions", response_model=None)
    async def create_session(request: Request) -> Response:
        if not _same_origin(request):
            return refused()
        form: dict[str, str] = {}
        try:
            form = await _form(request)
            created = await in_thread(console.create_session, form.get("id", ""),
                                      form.get("timeZone", "").strip())
        except ConsoleError as exc:
            return await sessions_page(str(exc), form_id=form.get("id", "")[:64],
                                       form_zone=form.get("timeZone", "")[:64],
                                       status_code=400)
        return RedirectResponse(f"/session/{quote(created, safe='')}", status_code=303)

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

    @app.get("/session/{session_id:path}", response_class=HTMLResponse)
    async def session(session_id: str) -> HTMLResponse:
        if not console.exists(session_id):
            return page("missing.html", 404, nav="sessions", session_id=session_id)
        view = await in_thread(console.session_page, session_id)
        shown = model.LIFECYCLE_HELP if console.settings.lifecycle else model.HELP
        return page("session.html", nav="session", page=view, help=shown,
                    calendar=console.settings.calendar)

    @app.post("/prompt/{session_id:path}", response_model=None)
    async def prompt(session_id: str, request: Request) -> Response:
        def turn(form: dict[str, str]) -> None:  # the transcript is the answer
            console.prompt(session_id, form.get("text", ""),
                           form.get("clientTimeZone") or None)
        return await answer_form(session_id, request, turn)

    async def act(session_id: str, request: Request,
                  call_of: Callable[[dict[str, str]], Any]) -> Response:
        """A form of the page calls one tool through the agent's own handler; the
        answer is the acknowledgement (docs/web.md#acting-from-the-page)."""
        return await answer_form(session_id, request, lambda form: console.act(
            session_id, call_of(form), form.get("clientTimeZone") or None))

    async def answer_form(session_id: str, request: Request,
                          run: Callable[[dict[str, str]], str | None]) -> Response:
        """A same-origin form post run in a thread: a redirect to the session page, or
        for htmx its transcript, with ``run``'s acknowledgement when it gives one; the
        console's own refusal is a one-line 400 that changed nothing."""
        if not _same_origin(request):
            return refused()
        htmx = request.headers.get("hx-request") == "true"
        try:
            form = await _form(request)
            reply = await in_thread(run, form)
        except ConsoleError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        if not htmx:
            return RedirectResponse(f"/session/{quote(session_id, safe='')}", status_code=303)
        view = await in_thread(console.session_page, session_id)
        headers = {ACKNOWLEDGEMENT: quote(reply, safe="")} if reply is not None else None
        return HTMLResponse(render("_transcript.html", page=view), headers=headers)

    @app.post("/create/{session_id:path}", response_model=None)
    async def create_reminder(session_id: str, request: Request) -> Response:
        return await act(session_id, request, lambda form: create_call(
            form, calendar=console.settings.calendar, lifecycle=console.settings.lifecycle))

    @app.post("/update/{session_id:path}", response_model=None)
    async def update_reminder(session_id: str, request: Request) -> Response:
        """The edit form and the pause and resume buttons (with the lifecycle on)."""
        return await act(session_id, request, lambda form: update_call(
            form, calendar=console.settings.calendar))

    @app.post("/delete/{session_id:path}", response_model=None)
    async def delete_reminder(session_id: str, request: Request) -> Response:
        return await act(session_id, request, delete_call)

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        return Response(FAVICON, media_type="image/svg+xml",
                        headers={"Cache-Control": "max-age=86400"})

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

    # -- operations -------------------------------------------------------------------

    async def figures() -> dict[str, Any]:
        status = await in_thread(console.status)
        lateness = await in_thread(console.lateness)
        return {
            "status": status if isinstance(status, Status) else None,
            "status_error": status if isinstance(status, str) else None,
            "status_json": (msgspec.json.format(msgspec.json.encode(status)).decode()
                            if isinstance(status, Status) else ""),
            "lateness": lateness,
            "embedded": console.embedded,
            "step_age_s": console.step_age_s(),
            "stepping_ok": console.stepping_ok(),
            "deliveries": console.deliveries,
        }

    @app.get("/operations", response_class=HTMLResponse)
    async def operations() -> HTMLResponse:
        return page("operations.html", nav="operations", **await figures())

    @app.get("/operations/figures", response_class=HTMLResponse)
    async def operations_figures() -> HTMLResponse:
        return HTMLResponse(render("_figures.html", **await figures()),
                            headers={"Cache-Control": "no-store"})

    @app.get("/api/status", response_model=None)
    async def api_status() -> Response:
        """What ``dsh-schedule status --json`` prints."""
        status = await in_thread(console.status)
        if isinstance(status, str):
            return JSONResponse({"error": status}, status_code=503)
        return Response(msgspec.json.encode(status), media_type="application/json")

    return app


def _login_routes(app: FastAPI, token: str, login_page: Callable[..., HTMLResponse],
                  limit: LoginLimit) -> None:
    """``GET /login`` shows the sign-in form; ``POST /login`` with the right token sets
    the cookie (HttpOnly, SameSite=Strict, a digest of the token) and goes to the
    sessions; an address past its sign-in attempts (``limit``) gets 429 and when to try
    again."""

    @app.get(LOGIN_PATH, response_class=HTMLResponse)
    async def login_form() -> HTMLResponse:
        return login_page(200)

    @app.post(LOGIN_PATH, response_model=None)
    async def login(request: Request) -> Response:
        if not _same_origin(request):
            return PlainTextResponse("refused: a form of another site", status_code=403)
        wait_s = limit.take(request.client.host if request.client else "")
        if wait_s > 0:
            after = math.ceil(wait_s)
            return PlainTextResponse(
                f"refused: too many sign-in attempts from this address; try again in "
                f"{after} s\n", status_code=429,
                headers={"Retry-After": str(after), "Cache-Control": "no-store"})
        try:
            offered = (await _form(request)).get("token", "")
        except ConsoleError as exc:
            return login_page(400, str(exc))
        if not token_matches(token, offered.strip()):
            return login_page(401, "That is not the console's token.")
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, cookie_value(token), httponly=True, samesite="strict",
                            path="/")
        return response


def _stream(events: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(events, media_type="text/event-stream",
                             headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
