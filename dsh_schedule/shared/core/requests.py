"""The management tools' arguments and the create record they build
(docs/architecture.md#management-tools).

``parse_*_args`` check shape only and run before the per-agent queue. ``build_create``
runs inside the transaction with the fold and one ``now`` sample; every ``at`` error and
every range error surfaces there.

``schedule_create`` checks run in this order, so the first failing one is answered:

1. arguments not an object, a key other than ``prompt``/``after_seconds``/``at``/
   ``every_seconds``, or not exactly one selector key → ``invalid_selector``;
2. ``prompt`` missing, not a string, empty after trimming, holding a lone surrogate, or
   longer than the limit (``max_prompt_bytes`` of UTF-8 after trimming, by default
   ``DEFAULT_MAX_PROMPT_BYTES``) → ``invalid_prompt``;
3. the selector's value: ``after_seconds`` not a positive safe integer, or
   ``every_seconds`` not a safe integer → ``invalid_rule``; ``every_seconds`` < 300 →
   ``frequency_too_high``. The ``at`` value is kept as given and resolved by
   ``build_create``.

A safe ``every_seconds`` whose milliseconds are not (above ``MAX_EVERY_SECONDS``) puts
its first target past year 9999, so ``build_create`` answers ``time_out_of_range``.

A selector key given with ``null`` still counts as given.

The prompt limit holds for new creates only: replay never measures a prompt, so a log
that holds a longer one (written before the limit, or under a higher one) folds and
delivers as before. So does the bound on a session's recurring prompts together
(``batchbound``): ``build_create`` refuses, last, a recurring record whose batch could
make a delivery line past the log's bound (``invalid_prompt``).

Calendar rules (docs/decisions.md#calendar-rules) are offered only when the caller enables
them (``calendar=True``): then ``cron`` is a fourth selector key, its shape, grammar and
frequency are checked in step 3 (``invalid_rule``, ``frequency_too_high``) and its zone
and first occurrence by ``build_create``. Disabled, ``cron`` is an unknown key like any
other (``invalid_selector``), whose message says that calendar rules exist and how a
deployment turns them on.

Each message names the selector the call used: a ``cron`` rule without a zone that the
turn does not confirm answers ``timezone_confirmation_required`` about the rule's
``time_zone``, not about ``at``'s.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final, Literal

import msgspec

from dsh_schedule.shared.core.batchbound import (
    MAX_LINE_BYTES,
    batch_limit_message,
    fits_one_batch,
)
from dsh_schedule.shared.core.cron import read_cron_selector
from dsh_schedule.shared.core.cron_occurrences import resolve_cron
from dsh_schedule.shared.core.errors import ToolError
from dsh_schedule.shared.core.fold import FoldState, allocate_id
from dsh_schedule.shared.core.instant import (
    MAX_MS,
    MAX_SAFE_INTEGER,
    MIN_MS,
    format_instant,
    parse_instant,
)
from dsh_schedule.shared.core.records import (
    MIN_EVERY_SECONDS,
    RECURRING_TYPES,
    AfterSchedule,
    AtSchedule,
    CreateChange,
    CronSchedule,
    EverySchedule,
    RecurringSchedule,
    Schedule,
    create_change,
    is_utf8_safe,
    js_trim,
)
from dsh_schedule.shared.core.timesel import resolve_at

SelectorKind = Literal["after", "at", "every", "cron"]

SELECTOR_KEYS: Final[dict[str, SelectorKind]] = {
    "after_seconds": "after",
    "at": "at",
    "every_seconds": "every",
}
CREATE_KEYS: Final = frozenset({"prompt", *SELECTOR_KEYS})
# The longest prompt a create accepts by default, in bytes of UTF-8 after trimming
# (``Settings.max_prompt_bytes``, docs/architecture.md#timings).
DEFAULT_MAX_PROMPT_BYTES: Final[int] = 32 * 1024
# With calendar rules enabled: ``cron`` is a selector too.
CRON_KEY: Final = "cron"
CALENDAR_SELECTOR_KEYS: Final[dict[str, SelectorKind]] = {**SELECTOR_KEYS, CRON_KEY: "cron"}
CALENDAR_CREATE_KEYS: Final = frozenset({"prompt", *CALENDAR_SELECTOR_KEYS})

_MSG_AFTER: Final[str] = (
    "after_seconds must be a positive whole number of seconds, at most 9007199254740991."
)
_MSG_EVERY: Final[str] = (
    "every_seconds must be a whole number of seconds from 300 to 9007199254740."
)
_MSG_SELECTOR_CALENDAR: Final[str] = (
    "Provide exactly one of after_seconds, at, every_seconds, or cron, and no other keys."
)
_MSG_CRON_OFF: Final[str] = (
    "cron is a calendar rule, and calendar rules are not enabled here (the deployment "
    "enables them with DSH_SCHEDULE_CALENDAR=on, or calendar=True on the plugin). Provide "
    "exactly one of after_seconds, at, or every_seconds, and no other keys."
)
_MSG_CRON_CONFIRM: Final[str] = (
    "This cron rule has no time_zone, and the user's time zone is not confirmed for this "
    "request. Ask the user which time zone they mean, then pass the rule as "
    '{"expression": "...", "time_zone": "..."} with "UTC" or an IANA Area/Location name.'
)
_MSG_SURROGATE: Final[str] = "prompt must be valid Unicode text; it holds an unpaired surrogate."
_MSG_DELETE: Final[str] = (
    'schedule_delete takes exactly {"id": "schedule-N"}: a non-empty string id without '
    "surrounding whitespace."
)
_MSG_LIST: Final[str] = "schedule_list takes no arguments; pass {}."
# The lifecycle's end conditions (docs/decisions.md#lifecycle-editing-pausing-and-ending-
# reminders), offered with ``lifecycle=True``.
END_KEYS: Final = frozenset({"until", "count"})
MSG_COUNT: Final[str] = "count must be a whole number from 1 to 9007199254740991."
MSG_END_ON_ONE_SHOT: Final[str] = "until and count apply only to a recurring reminder."
MSG_UNTIL_NULL: Final[str] = "until must be a time given as at is, not null."
MSG_UNTIL: Final[str] = "until must not be before the reminder's next time."
MSG_LIMIT: Final[str] = (
    "This session already has {limit} active reminders, the most it may hold; delete one "
    "(or let one run out) before creating another.")


class CreateRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A shape-checked ``schedule_create`` call; exactly the field of ``kind`` is set.

    ``prompt`` is already trimmed; ``at`` and ``cron`` are the raw selector values, as is
    ``until`` (None: not given); ``count`` is checked.
    """

    kind: SelectorKind
    prompt: str
    after_seconds: int | None = None
    at: Any = None
    every_seconds: int | None = None
    cron: Any = None
    until: Any = None
    count: int | None = None


def _whole_number(value: Any) -> int | None:
    """An int, or an integral finite float such as ``600.0``; never a bool or a string."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return None


def _selector_kind(args: Any, calendar: bool = False) -> SelectorKind:
    keys, selectors = (
        (CALENDAR_CREATE_KEYS, CALENDAR_SELECTOR_KEYS) if calendar else (CREATE_KEYS, SELECTOR_KEYS)
    )
    message = _MSG_SELECTOR_CALENDAR if calendar else None
    if not calendar and isinstance(args, dict) and CRON_KEY in args:
        raise ToolError("invalid_selector", _MSG_CRON_OFF)
    if not isinstance(args, dict) or not set(args) <= keys:
        raise ToolError("invalid_selector", message)
    given = [kind for key, kind in selectors.items() if key in args]
    if len(given) != 1:
        raise ToolError("invalid_selector", message)
    return given[0]


def prompt_limit_message(max_prompt_bytes: int) -> str:
    """The ``invalid_prompt`` message for a prompt longer than ``max_prompt_bytes``."""
    return (f"prompt must be at most {max_prompt_bytes} bytes of UTF-8 after trimming "
            "whitespace; shorten it.")


def _prompt(args: dict[str, Any], max_prompt_bytes: int) -> str:
    raw = args.get("prompt")
    if not isinstance(raw, str):
        raise ToolError("invalid_prompt")
    prompt = js_trim(raw)
    if prompt == "":
        raise ToolError("invalid_prompt")
    if not is_utf8_safe(prompt):
        raise ToolError("invalid_prompt", _MSG_SURROGATE)
    # A character takes 1 to 4 bytes: only a prompt in between needs encoding to tell.
    if len(prompt) > max_prompt_bytes or (
        4 * len(prompt) > max_prompt_bytes and len(prompt.encode("utf-8")) > max_prompt_bytes
    ):
        raise ToolError("invalid_prompt", prompt_limit_message(max_prompt_bytes))
    return prompt


def _after_seconds(value: Any) -> int:
    seconds = _whole_number(value)
    if seconds is None or not 1 <= seconds <= MAX_SAFE_INTEGER:
        raise ToolError("invalid_rule", _MSG_AFTER)
    return seconds


def _every_seconds(value: Any) -> int:
    seconds = _whole_number(value)
    if seconds is None or not -MAX_SAFE_INTEGER <= seconds <= MAX_SAFE_INTEGER:
        raise ToolError("invalid_rule", _MSG_EVERY)
    if seconds < MIN_EVERY_SECONDS:
        raise ToolError("frequency_too_high")
    return seconds


def parse_create_args(
    args: Any, *, max_prompt_bytes: int = DEFAULT_MAX_PROMPT_BYTES, calendar: bool = False,
    lifecycle: bool = False,
) -> CreateRequest:
    """The ``schedule_create`` request, or the first shape error in the module's order;
    a prompt may hold at most ``max_prompt_bytes`` bytes of UTF-8 after trimming.

    ``calendar`` offers the ``cron`` selector; without it ``cron`` is an unknown key.
    ``lifecycle`` offers the end conditions ``until`` and ``count`` of a recurring record,
    checked after the selector: ``count`` not a safe integer ≥ 1, or either on a one-shot,
    → ``invalid_rule``; without it they are unknown keys.
    """
    if lifecycle and isinstance(args, dict) and END_KEYS & set(args):
        request = parse_create_args(
            {k: v for k, v in args.items() if k not in END_KEYS},
            max_prompt_bytes=max_prompt_bytes, calendar=calendar)
        count = read_count(args["count"]) if "count" in args else None
        if "until" in args and args["until"] is None:
            raise ToolError("invalid_rule", MSG_UNTIL_NULL)
        if request.kind in ("after", "at"):
            raise ToolError("invalid_rule", MSG_END_ON_ONE_SHOT)
        return msgspec.structs.replace(
            request, until=args.get("until"), count=count)
    kind = _selector_kind(args, calendar)
    prompt = _prompt(args, max_prompt_bytes)
    if kind == "cron":
        read_cron_selector(args[CRON_KEY])  # shape, grammar and frequency, before any zone
        return CreateRequest(kind="cron", prompt=prompt, cron=args[CRON_KEY])
    if kind == "after":
        return CreateRequest(
            kind="after", prompt=prompt, after_seconds=_after_seconds(args["after_seconds"])
        )
    if kind == "every":
        return CreateRequest(
            kind="every", prompt=prompt, every_seconds=_every_seconds(args["every_seconds"])
        )
    return CreateRequest(kind="at", prompt=prompt, at=args["at"])


def read_count(value: Any) -> int:
    """An end condition's ``count``: a safe integer ≥ 1, read as the seconds are (``3.0``
    is 3, as the schema's ``integer`` allows; a bool is not), else ``invalid_rule``."""
    count = _whole_number(value)
    if count is None or not 1 <= count <= MAX_SAFE_INTEGER:
        raise ToolError("invalid_rule", MSG_COUNT)
    return count


def parse_delete_args(args: Any) -> str:
    """The id of a ``schedule_delete {id}`` call; ``invalid_rule`` for anything else.

    The id must be a non-empty string, unchanged by trimming and storable as UTF-8.
    """
    if not isinstance(args, dict) or set(args) != {"id"}:
        raise ToolError("invalid_rule", _MSG_DELETE)
    schedule_id = args["id"]
    if (
        not isinstance(schedule_id, str)
        or schedule_id == ""
        or js_trim(schedule_id) != schedule_id
        or not is_utf8_safe(schedule_id)
    ):
        raise ToolError("invalid_rule", _MSG_DELETE)
    return schedule_id


def parse_list_args(args: Any) -> None:
    """Accept ``schedule_list {}`` (or no arguments at all); ``invalid_selector`` else."""
    if args is None or (isinstance(args, dict) and not args):
        return
    raise ToolError("invalid_selector", _MSG_LIST)


def _target_after(now_ms: int, seconds: int) -> str:
    """``now + seconds`` as a canonical instant; ``time_out_of_range`` beyond the range."""
    target = now_ms + seconds * 1000
    if not MIN_MS <= target <= MAX_MS:
        raise ToolError("time_out_of_range")
    return format_instant(target)


def _cron_zone(zone: Callable[[], str]) -> Callable[[], str]:
    """``zone``, its confirmation error worded for a ``cron`` rule (same code and extras)."""

    def implicit() -> str:
        try:
            return zone()
        except ToolError as exc:
            if exc.code != "timezone_confirmation_required":
                raise
            raise ToolError(exc.code, _MSG_CRON_CONFIRM, **exc.extra) from None

    return implicit


def build_create(
    request: CreateRequest, state: FoldState, now_ms: int, zone: Callable[[], str],
    *, line_bytes: int = MAX_LINE_BYTES, max_active: int | None = None,
) -> CreateChange:
    """The create record for ``request`` at the single sample ``now_ms``.

    The id is the next never-used ``schedule-N`` of ``state``. ``zone`` is called only
    for an ``at`` object or a ``cron`` rule without ``time_zone``. Raises the ``at`` errors of
    ``resolve_at`` and ``time_out_of_range``; the seconds of a request not made by
    ``parse_create_args`` are checked again and rejected as that function would. A
    recurring record that would let the session's recurring batch pass ``line_bytes``
    once delivered is refused with ``invalid_prompt`` (``batchbound``). With
    ``max_active`` (the lifecycle's cap), a session already holding that many active
    records answers ``limit_exceeded`` before anything else is resolved. ``until``
    resolves as ``at`` does (its errors) and must not be before the first target
    (``invalid_rule``).
    """
    if max_active is not None and len(state.active) >= max_active:
        raise ToolError("limit_exceeded", MSG_LIMIT.format(limit=max_active))
    schedule = _new_schedule(request, state, now_ms, zone)
    if isinstance(schedule, RECURRING_TYPES) and (
            request.until is not None or request.count is not None):
        schedule = _with_end(schedule, request, now_ms, zone)
    if isinstance(schedule, RECURRING_TYPES) and not fits_one_batch(
            state.active, schedule, line_bytes):
        raise ToolError("invalid_prompt", batch_limit_message(line_bytes))
    return create_change(schedule)


def _with_end(
    schedule: RecurringSchedule, request: CreateRequest, now_ms: int, zone: Callable[[], str]
) -> RecurringSchedule:
    until = None
    if request.until is not None:
        until = format_instant(resolve_at(request.until, now_ms=now_ms, implicit_zone=zone))
        if parse_instant(until) < parse_instant(schedule.scheduledAt):
            raise ToolError("invalid_rule", MSG_UNTIL)
    return msgspec.structs.replace(schedule, until=until, count=request.count)


def _new_schedule(
    request: CreateRequest, state: FoldState, now_ms: int, zone: Callable[[], str]
) -> Schedule:
    schedule_id = allocate_id(state)
    schedule: Schedule
    if request.kind == "after":
        after_seconds = _after_seconds(request.after_seconds)
        schedule = AfterSchedule(
            id=schedule_id,
            prompt=request.prompt,
            afterSeconds=after_seconds,
            scheduledAt=_target_after(now_ms, after_seconds),
        )
    elif request.kind == "every":
        every_seconds = _every_seconds(request.every_seconds)
        # The first target is the anchor every later occurrence stays aligned to; an
        # interval whose milliseconds are unsafe lands it past year 9999.
        schedule = EverySchedule(
            id=schedule_id,
            prompt=request.prompt,
            everySeconds=every_seconds,
            scheduledAt=_target_after(now_ms, every_seconds),
        )
    elif request.kind == "cron":
        # The first target is the rule's first occurrence strictly after the create.
        resolved = resolve_cron(request.cron, now_ms=now_ms, implicit_zone=_cron_zone(zone))
        schedule = CronSchedule(
            id=schedule_id,
            prompt=request.prompt,
            cron=resolved.rule.expression,
            timeZone=resolved.time_zone,
            scheduledAt=format_instant(resolved.scheduled_at_ms),
        )
    else:
        target = resolve_at(request.at, now_ms=now_ms, implicit_zone=zone)
        schedule = AtSchedule(
            id=schedule_id, prompt=request.prompt, scheduledAt=format_instant(target)
        )
    return schedule
