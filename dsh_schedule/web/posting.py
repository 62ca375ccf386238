"""What the console accepts from a browser: a form post from its own pages only, read
within bounds, and (with a token) the sign-in form that sets the cookie
(docs/web.md#access).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final
from urllib.parse import parse_qs, urlsplit

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response

from dsh_schedule.web.access import COOKIE, LOGIN_PATH, LoginLimit, cookie_value, token_matches
from dsh_schedule.web.forms import ConsoleError

MAX_FORM_BYTES: Final = 64 * 1024


async def read_form(request: Request) -> dict[str, str]:
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


def same_origin(request: Request) -> bool:
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



def refused() -> PlainTextResponse:
    return PlainTextResponse("refused: a form of another site", status_code=403)


def login_routes(app: FastAPI, token: str, login_page: Callable[..., HTMLResponse],
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
        if not same_origin(request):
            return PlainTextResponse("refused: a form of another site", status_code=403)
        wait_s = limit.take(request.client.host if request.client else "")
        if wait_s > 0:
            after = math.ceil(wait_s)
            return PlainTextResponse(
                f"refused: too many sign-in attempts from this address; try again in "
                f"{after} s\n", status_code=429,
                headers={"Retry-After": str(after), "Cache-Control": "no-store"})
        try:
            offered = (await read_form(request)).get("token", "")
        except ConsoleError as exc:
            return login_page(400, str(exc))
        if not token_matches(token, offered.strip()):
            return login_page(401, "That is not the console's token.")
        response = RedirectResponse("/", status_code=303)
        response.set_cookie(COOKIE, cookie_value(token), httponly=True, samesite="strict",
                            path="/")
        return response
