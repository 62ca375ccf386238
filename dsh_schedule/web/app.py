"""The web console's pages, fragments and live streams (FastAPI).

Pages are rendered on the server from Jinja templates with autoescaping on, and live
parts of a page are fed by server-sent events (``rendering``); form posts are taken from
the console's own pages only (``posting``). The vendored script (``static/htmx.min.js``)
posts the forms and polls the operations figures, and ``static/console.js`` connects the
streams, fills in the browser's time zone and runs the countdowns.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final
from urllib.parse import quote

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool

from dsh_schedule.shared.core.errors import PersistenceError, ScheduleLogError
from dsh_schedule.status import Status
from dsh_schedule.web import model
from dsh_schedule.web.access import (
    Access,
    AccessGuard,
    Asgi,
    LoginLimit,
    Scope,
    refused_without_token,
)
from dsh_schedule.web.console import (
    Console,
    ConsoleError,
    create_call,
    delete_call,
    update_call,
)
from dsh_schedule.web.posting import login_routes, read_form, refused, same_origin
from dsh_schedule.web.rendering import (
    FAVICON,
    STATIC,
    stream_routes,
    template_environment,
)

# The sessions page's filter of the active reminders: a local date and time, the browser's
# zone it is read in, and a text.
FILTER_FIELDS: Final = ("due_before", "zone", "q")
MAX_FILTER: Final = 200
ACKNOWLEDGEMENT: Final = "X-Acknowledgement"  # a form's answer, percent-encoded UTF-8


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
        login_routes(app, access.token, login_page, login_limit or LoginLimit())

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
        if not same_origin(request):
            return refused()
        form: dict[str, str] = {}
        try:
            form = await read_form(request)
            created = await in_thread(console.create_session, form.get("id", ""),
                                      form.get("timeZone", "").strip())
        except ConsoleError as exc:
            return await sessions_page(str(exc), form_id=form.get("id", "")[:64],
                                       form_zone=form.get("timeZone", "")[:64],
                                       status_code=400)
        return RedirectResponse(f"/session/{quote(created, safe='')}", status_code=303)


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
        if not same_origin(request):
            return refused()
        htmx = request.headers.get("hx-request") == "true"
        try:
            form = await read_form(request)
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


    stream_routes(app, console, render)

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

