"""The web console and the operations subcommands, ``status`` and ``health``
(docs/web.md, docs/architecture.md#operations)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Final

from dsh_schedule.cli.commands import stop_while_starting
from dsh_schedule.cli.common import (
    EXIT_UNHEALTHY,
    OPS_SOCKET_TIMEOUT_S,
    CommandError,
    await_redis,
    require_redis,
    settings_of,
)
from dsh_schedule.shared.settings import Settings
from dsh_schedule.terminal import terminal_json, terminal_text

if TYPE_CHECKING:
    import redis

# -- the web console --------------------------------------------------------------------

WEB_MODULES: Final = ("fastapi", "starlette", "uvicorn", "jinja2")


def cmd_web(args: argparse.Namespace) -> int:
    """The web console (docs/web.md): embedded without a Redis URL, else a host of the
    deployment that Redis coordinates."""
    import os
    import tempfile

    from dsh_schedule.web.access import TOKEN_ENV, Access, AccessError

    stop_while_starting()
    # How it is served is checked first: a console that would be open refuses to start.
    access = Access(bind=args.bind, allowed_hosts=tuple(args.allowed_host),
                    token=args.token or os.environ.get(TOKEN_ENV) or None,
                    allow_remote=args.allow_remote)
    try:
        access.check()
    except AccessError as exc:
        raise CommandError(f"web: {exc}") from None
    settings = settings_of(args)
    scratch: tempfile.TemporaryDirectory[str] | None = None
    if settings.redis_url:
        await_redis(settings.redis_url, args.redis_wait, verbose=args.verbose)
    elif args.sessions is None and "DSH_SCHEDULE_SESSIONS" not in os.environ:
        # Embedded and no directory named: the sessions live as long as the console.
        scratch = tempfile.TemporaryDirectory(prefix="dsh-web-")
        args.sessions = Path(scratch.name) / "sessions"
        settings = settings_of(args)
    try:
        from dsh_schedule.web.console import Console
        from dsh_schedule.web.server import WebServer
    except ModuleNotFoundError as exc:
        if exc.name not in WEB_MODULES:
            raise
        raise CommandError(
            f"web: needs the web extra ({exc.name} is missing): "
            "pip install '.[web]' from a checkout (README.md#install)"
        ) from None
    try:
        server = WebServer(Console(settings), host=args.bind, port=args.port,
                           allowed_hosts=access.allowed_hosts, token=access.token,
                           allow_remote=access.allow_remote)
    except OSError as exc:
        raise CommandError(
            f"web: cannot listen on {args.bind}:{args.port} ({exc.strerror or exc})"
        ) from None
    where = (f"a host on Redis {_where_url(settings.redis_url)}, queue {settings.queue!r}"
             if settings.redis_url else "embedded Redis, worker and mover in this process")
    print(f"dsh-schedule web: {server.url} ({where}; sessions in {settings.sessions})",
          flush=True)
    print(f"dsh-schedule web: {server.protection}", flush=True)
    try:
        server.serve()
    finally:
        if scratch is not None:
            scratch.cleanup()
    return 0


def _where_url(url: str) -> str:
    from dsh_schedule.shared.coordination.connection import location

    return location(url)


# -- operations -----------------------------------------------------------------------


def _ops_client(args: argparse.Namespace, command: str) -> tuple[Settings, redis.Redis]:
    """Settings and a client with bounded socket waits, once Redis answers."""
    settings = settings_of(args)
    url = require_redis(settings, command)
    await_redis(url, args.redis_wait, verbose=args.verbose)
    from dsh_schedule.shared.coordination.connection import connect

    client = connect(
        url, socket_connect_timeout=OPS_SOCKET_TIMEOUT_S, socket_timeout=OPS_SOCKET_TIMEOUT_S
    )
    return settings, client


def cmd_status(args: argparse.Namespace) -> int:
    import msgspec
    import redis

    from dsh_schedule import status
    from dsh_schedule.shared.coordination.agents import Coordination

    settings, client = _ops_client(args, "status")
    try:
        now_ms = Coordination(client, settings).clock()  # Redis's, as every process's
        report = status.read_status(client, settings, now_ms=now_ms,
                                    next_count=args.next)
    except redis.RedisError as exc:
        raise CommandError(f"status: Redis failed while reading ({type(exc).__name__})") from None
    finally:
        client.close()
    if args.json:
        sys.stdout.write(terminal_json(msgspec.json.encode(report).decode()) + "\n")
    else:
        print(status.render_status(report))
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    """Exit 0 when healthy, 1 (with one line saying why) when not, Redis unreachable
    included; 2 only for input the command cannot use."""
    import msgspec
    import redis

    from dsh_schedule import status
    from dsh_schedule.shared.coordination.agents import Coordination

    try:
        settings, client = _ops_client(args, "health")
    except CommandError as exc:
        if "did not answer" not in str(exc):
            raise
        health = status.Health(ok=False, reason=str(exc))
    else:
        try:
            # An explicit --queue must have a worker even without live agents.
            coordination = Coordination(client, settings)
            health = status.check_health(
                coordination, settings, now_ms=coordination.clock(),
                also=[args.queue] if args.queue else [],
            )
        except redis.RedisError as exc:
            health = status.Health(ok=False,
                                   reason=f"Redis failed while checking ({type(exc).__name__})")
        finally:
            client.close()
    if args.json:
        sys.stdout.write(terminal_json(msgspec.json.encode(health).decode()) + "\n")
    else:
        print(f"{'ok' if health.ok else 'unhealthy'}: {terminal_text(health.reason)}")
    return 0 if health.ok else EXIT_UNHEALTHY
