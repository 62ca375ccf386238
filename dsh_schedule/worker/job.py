"""The two rq job functions behind every wake (docs/architecture.md#wake-projection).

``wake(agent, target_ms)`` is one wake: a scheduled one (rq-scheduler moved it) or an
immediate one (a new lease, a released phase). ``wake_batch(payload)`` carries a typed
batch: the mover's due wakes, or a rebuild's immediate wakes.

The due owner that performs them comes from the worker that runs the job: our ``worker``
process and the embedded system run jobs under ``serving(owner)``. A stock rq worker
started on our queue, with the ``DSH_SCHEDULE_*`` settings in its environment, gets an
owner built from those settings and the job's own Redis connection, once per process.

Every line logged while a job runs carries its rq job id as ``wake_id``
(docs/architecture.md#operations).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import msgspec
import redis
from rq import get_current_job

from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.coordination.wake_jobs import (
    WAKE_BATCH_FUNC,
    WAKE_FUNC,
    DueWakes,
    decode_wakes,
)
from dsh_schedule.shared.coordination.workers import Held
from dsh_schedule.shared.logging_setup import log_context
from dsh_schedule.shared.settings import Settings
from dsh_schedule.shared.store.naming import store_from_settings
from dsh_schedule.worker.due import DueOwner

log = logging.getLogger(__name__)

_serving: ContextVar[DueOwner | None] = ContextVar("dsh_schedule_due_owner", default=None)
_built: dict[tuple[Settings, int], DueOwner] = {}


@contextmanager
def serving(owner: DueOwner) -> Iterator[None]:
    """Run the wake jobs of this block (in this thread) with ``owner``."""
    token = _serving.set(owner)
    try:
        yield
    finally:
        _serving.reset(token)


def build_owner(client: redis.Redis, settings: Settings) -> DueOwner:
    """The due owner for a deployment's settings, on the clock every process shares
    (Redis's)."""
    store = store_from_settings(settings)
    coordination = Coordination(client, settings)
    return DueOwner(store, coordination, settings, clock=coordination.clock)


def _owner() -> DueOwner:
    owner = _serving.get()
    if owner is not None:
        return owner
    # A stock rq worker: build from the environment, on the connection the job came on.
    settings = Settings.from_env()
    job = get_current_job()
    if job is None:
        raise RuntimeError("a wake job must run inside an rq worker")
    connection: redis.Redis = job.connection
    key = (settings, id(connection))
    if key not in _built:
        _built[key] = build_owner(connection, settings)
    return _built[key]


def _job_id() -> str | None:
    """The id of the rq job running now (None outside a job); reads no Redis."""
    job = get_current_job()
    return None if job is None else str(job.id)


def wake(agent: str, target_ms: int | None) -> str:
    """One wake; returns its outcome's name (rq keeps no result: ``result_ttl=0``)."""
    with log_context(wake_id=_job_id(), agent=agent):
        return _owner().wake([(agent, target_ms)])[agent].value


def wake_batch(payload: Any) -> dict[str, str]:
    """A batch of wakes, performed as one batched due transaction; one wake's failure
    spares the rest."""
    with log_context(wake_id=_job_id()):
        try:
            batch = decode_wakes(payload)
        except msgspec.ValidationError as exc:
            log.error("malformed wake batch dropped: %s", exc)
            return {}
        if isinstance(batch, DueWakes):
            wakes: list[tuple[str, int | None]] = [(w.agent, w.target_ms)
                                                   for w in batch.wakes]
        else:
            wakes = [(agent, None) for agent in batch.agents]
        outcomes = _owner().wake(wakes)
        return {agent: outcome.value for agent, outcome in outcomes.items()}


def held_by(job: Any, queue: str) -> Held | None:
    """What a worker holds while it executes ``job``: the job and its agents (None for a
    job that is not a wake, or one whose arguments do not decode: nothing to wake again
    if the worker dies). Decodes only what rq has already loaded."""
    try:
        func, args = job.func_name, job.args
        if func == WAKE_FUNC and args and isinstance(args[0], str):
            return Held(str(job.id), queue, (args[0],))
        if func == WAKE_BATCH_FUNC and len(args) == 1:
            batch = decode_wakes(args[0])
            if isinstance(batch, DueWakes):
                agents = tuple(dict.fromkeys(w.agent for w in batch.wakes))
            else:
                agents = tuple(dict.fromkeys(batch.agents))
            return Held(str(job.id), queue, agents)
    except Exception:  # a job rq cannot decode fails in rq's own hands, not here
        return None
    return None
