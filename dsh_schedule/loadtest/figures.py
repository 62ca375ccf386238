"""The load test's figures: what each phase measured, beside the bare libraries where a
baseline makes sense, and their ratios (docs/benchmarks.md#what-is-measured).

Ratios are cost ratios: our cost divided by what the bare libraries alone cost (for rates,
the bare rate divided by ours), so ``> 1`` means costlier than the libraries alone.
"""

from __future__ import annotations

import msgspec

from dsh_schedule.loadtest.stats import ArmCurve, Latency, cost_ratio
from dsh_schedule.loadtest.unloaded import UnloadedFigure


class CreateFigure(msgspec.Struct, frozen=True, kw_only=True):
    hosts: int
    agents: int
    threads: int
    count: int
    errors: int
    seconds: float
    per_s: float | None
    latency: Latency
    bare_per_s: float | None
    bare_latency: Latency
    ratio_per_s: float | None
    ratio_p50: float | None
    ratio_p99: float | None
    # The same creates as recurring reminders, each kind on fresh agents of its own with
    # calendar rules enabled: every_seconds, then cron rules in several zones; cron_vs_every
    # is every's rate over cron's (> 1: cron creates are costlier).
    every_per_s: float | None = None
    every_latency: Latency | None = None
    cron_per_s: float | None = None
    cron_latency: Latency | None = None
    cron_vs_every: float | None = None
    # The lifecycle (docs/decisions.md#lifecycle-editing-pausing-and-ending-reminders), in
    # alternating blocks, each on fresh agents: creates with the switch off, creates with it
    # on, then prompt updates of those records with it on; each rate over the off creates'
    # (< 1: slower than creates without the switch).
    lifecycle_off_per_s: float | None = None
    lifecycle_create_per_s: float | None = None
    lifecycle_update_per_s: float | None = None
    lifecycle_create_vs_off: float | None = None
    lifecycle_update_vs_off: float | None = None


class SessionSize(msgspec.Struct, frozen=True, kw_only=True):
    """Creates on one session pre-filled with ``events`` events (``file_bytes`` on disk)."""

    events: int
    file_bytes: int
    first_call_ms: float | None
    per_s: float | None
    latency: Latency
    bare_per_s: float | None
    bare_latency: Latency


class LongSessionFigure(msgspec.Struct, frozen=True, kw_only=True):
    calls: int
    errors: int
    sizes: list[SessionSize]
    ratio: float | None
    ratio_p50: float | None
    ratio_p99: float | None
    bare_ratio: float | None


class DueFigure(msgspec.Struct, frozen=True, kw_only=True):
    """Due transactions (one dispatch each) on one worker, and on ``workers`` of them."""

    workers: int
    count: int
    dispatched: int
    move_seconds: float
    seconds: float
    per_worker_per_s: float | None
    bare_per_worker_per_s: float | None
    ratio: float | None
    all_workers_per_s: float | None
    bare_all_workers_per_s: float | None


class LatenessFigure(msgspec.Struct, frozen=True, kw_only=True):
    hosts: int
    reminders: int
    delivered: int
    missing: int
    window_s: float
    mover_interval_s: float
    followup: Latency
    session: Latency
    bare: Latency
    ratio_p99: float | None


class RebuildFigure(msgspec.Struct, frozen=True, kw_only=True):
    agents: int
    records_per_agent: int
    db: int | None
    lease_restore_seconds: float
    enqueue_seconds: float
    seconds: float | None
    armed: int
    cold_seconds: float | None
    bare_seconds: float | None
    ratio: float | None


class MemoryFigure(msgspec.Struct, frozen=True, kw_only=True):
    agents: int
    bytes_per_agent: float | None
    by_key: dict[str, float]
    used_memory_delta_per_agent: float | None
    bare_bytes_per_job: float | None
    ratio: float | None
    note: str | None


class CpuWindow(msgspec.Struct, frozen=True, kw_only=True):
    """What each process cost over a measured window: CPU seconds per second (cores) of
    each (``redis-server`` included; None when it could not be read), their sum, that
    sum per 1 000 agents, and Redis commands per second."""

    seconds: float
    processes: dict[str, float | None]
    total_cores: float | None
    cores_per_1000_agents: float | None
    commands_per_s: float
    commands_by_type: dict[str, float]
    """Calls per second of each Redis command (``INFO commandstats``), busiest first."""
    redis_cpu_from: str
    """``proc``: the redis-server's ``/proc/<pid>/stat``; ``info``: its ``INFO cpu``."""


class IdleFigure(msgspec.Struct, frozen=True, kw_only=True):
    """N live idle agents (one far-future reminder each) on real processes, and N idle
    rq-scheduler jobs with rq-scheduler's own loop and stock rq workers."""

    agents: int
    host_processes: int
    workers: int
    ready_seconds: float
    warmup_s: float
    ours: CpuWindow
    bare: CpuWindow
    ratio: float | None
    ratio_commands: float | None
    bytes_per_agent: float | None = None
    """``INFO memory`` ``used_memory`` once every agent was armed, less before the
    processes started, over N: what a live idle agent holds in Redis."""
    bytes_by_key: dict[str, float] = {}
    """``MEMORY USAGE`` per agent of each kind of key an idle agent holds (its rq wake job
    included) and its share of the keys all agents share."""
    host_rss_mib: float | None = None
    worker_rss_mib: float | None = None  # the largest worker's
    flush_recovery_seconds: float | None = None
    """From every key of the run lost at once (one transaction, as a flush loses them)
    until every agent's wake is armed again and the queue is idle."""
    arming: ArmCurve | None = None
    """The arming rate over the first and the last tenth of the agents, from the host's
    start (its start-up included in the first tenth)."""
    flush_arming: ArmCurve | None = None  # the same after the flush


class BurstFigure(msgspec.Struct, frozen=True, kw_only=True):
    """N reminders due in the same second on N agents: due -> dispatch (the worker's
    dispatch record, written with its followup entry) and due -> the delivered message
    in the session; the bare counterpart is N rq jobs due at once."""

    agents: int
    created: int
    errors: int
    due_at: str
    slack_s: float
    """Seconds from the last create's answer to the due second (negative: too late)."""
    dispatched: int
    delivered: int
    missing: int
    followup: Latency
    session: Latency
    bare_jobs: int
    bare: Latency
    bare_slack_s: float
    ratio_p99: float | None
    cpu_s: dict[str, float | None] = {}
    """CPU seconds each process (``redis-server`` included) spent from the due second
    until the last delivery."""


class ProcessMemoryFigure(msgspec.Struct, frozen=True, kw_only=True):
    """Resident memory (``VmRSS``; ``VmHWM`` the peak) of one worker and one host process
    after each of K sessions of E events was woken and served once."""

    sessions: int
    events_per_session: int
    session_bytes: int
    served: int
    seconds: float | None
    worker_rss_bytes: int | None
    worker_hwm_bytes: int | None
    worker_start_rss_bytes: int | None
    host_rss_bytes: int | None
    host_hwm_bytes: int | None
    scheduler_rss_bytes: int | None
    bare_worker_rss_bytes: int | None
    note: str | None


class PeerIdle(msgspec.Struct, frozen=True, kw_only=True):
    """N far-future delivery jobs on one peer (``loadtest.peers``)."""

    peer: str
    jobs: int
    workers: int
    ours: CpuWindow
    """The peer's own window: its workers and the redis-server."""
    bytes_per_job: float | None
    """``used_memory`` after enqueuing the N jobs less before, over N."""


class PeerBurst(msgspec.Struct, frozen=True, kw_only=True):
    """N delivery jobs due in the same second on one peer: due -> job ran."""

    peer: str
    jobs: int
    workers: int
    ran: int
    slack_s: float
    latency: Latency


class PeersFigure(msgspec.Struct, frozen=True, kw_only=True):
    """The peers beside the idle and burst figures, and our figure over the best peer's
    (``> 1``: costlier or later than the best peer)."""

    idle: list[PeerIdle]
    burst: list[PeerBurst]
    ratio_idle_cores: float | None
    ratio_idle_commands: float | None
    ratio_idle_bytes: float | None
    ratio_burst_p50: float | None
    ratio_burst_p99: float | None


def _best(values: list[float | None]) -> float | None:
    measured = [v for v in values if v is not None]
    return min(measured) if measured else None


def peers_figure(idle: IdleFigure | None, burst: BurstFigure | None,
                 peer_idle: list[PeerIdle], peer_burst: list[PeerBurst]) -> PeersFigure:
    """The peers' figures with our ratio to the best of them."""
    return PeersFigure(
        idle=peer_idle, burst=peer_burst,
        ratio_idle_cores=cost_ratio(idle.ours.total_cores if idle else None,
                                    _best([p.ours.total_cores for p in peer_idle])),
        ratio_idle_commands=cost_ratio(idle.ours.commands_per_s if idle else None,
                                       _best([p.ours.commands_per_s for p in peer_idle])),
        ratio_idle_bytes=cost_ratio(idle.bytes_per_agent if idle else None,
                                    _best([p.bytes_per_job for p in peer_idle])),
        ratio_burst_p50=cost_ratio(burst.followup.p50_ms if burst else None,
                                   _best([p.latency.p50_ms for p in peer_burst])),
        ratio_burst_p99=cost_ratio(burst.followup.p99_ms if burst else None,
                                   _best([p.latency.p99_ms for p in peer_burst])),
    )


class Figures(msgspec.Struct, kw_only=True):
    create: CreateFigure | None = None
    long_session: LongSessionFigure | None = None
    due: DueFigure | None = None
    lateness: LatenessFigure | None = None
    rebuild: RebuildFigure | None = None
    memory: MemoryFigure | None = None
    idle: IdleFigure | None = None
    burst: BurstFigure | None = None
    process_memory: ProcessMemoryFigure | None = None
    peers: PeersFigure | None = None
    unloaded: UnloadedFigure | None = None
