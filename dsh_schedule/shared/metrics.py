"""Prometheus metrics of the worker, the scheduler and the host (docs/architecture.md#operations).

Metrics are off by default. Until ``enable`` installs a Prometheus recorder (``serve`` does,
and also starts the HTTP endpoint), ``get()`` answers a ``Metrics`` whose every method
does nothing, and prometheus-client is not even imported: a process without a metrics
port pays one method call that returns at once per recorded event.

Each process exports what it measures:

- the worker: ``dsh_schedule_lateness_seconds{stage="followup"}``,
  ``dsh_schedule_due_transaction_seconds``, ``dsh_schedule_dispatches_total{kind}``,
  ``dsh_schedule_wakes_total{outcome}``, ``dsh_schedule_deliveries_total{outcome="reprojected"}``;
- the host (the tools and the host bridge): ``dsh_schedule_lateness_seconds{stage="session"}``,
  ``dsh_schedule_tool_call_seconds{tool}``, ``dsh_schedule_tool_calls_total{tool,code}``,
  ``dsh_schedule_deliveries_total{outcome="delivered"|"dropped"}``,
  ``dsh_schedule_last_pass_timestamp_seconds{loop="lease_renewal"}``;
- the scheduler: the gauges ``dsh_schedule_live_agents``, ``dsh_schedule_scheduled_wakes``
  (set by each rebuild or reconcile pass) and ``dsh_schedule_followups_pending`` (set by
  each reconcile pass), from what the pass reads anyway plus one ``ZCARD`` and an ``XLEN``
  per non-empty followup stream, and
  ``dsh_schedule_last_pass_timestamp_seconds{loop="mover"|"reconcile"}``;
- every process: ``dsh_schedule_redis_errors_total``, and once it has read Redis's clock
  ``dsh_schedule_clock_skew_seconds`` (its wall clock minus Redis's, at its last
  measurement: docs/decisions.md#one-clock-for-every-decision).

``dsh_schedule_redis_errors_total`` exists from the start in every process (at zero);
every other metric appears once its process first records it, so no process exports a
metric it does not measure. Lateness is one observation per followup (worker) or
delivered message (host): the time it was written or appended minus the earliest
occurrence it carries, in seconds, never below zero.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from dsh_schedule.shared.core.instant import parse_instant

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

TOOLS: Final = ("schedule_create", "schedule_list", "schedule_delete", "schedule_update")
LATENESS_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
    3600.0, 21600.0, 86400.0,
)
DURATION_BUCKETS: Final = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)


class Metrics:
    """What the code records. This base records nothing: metrics are off."""

    enabled: bool = False

    def tool_call(self, tool: str, code: str, seconds: float) -> None:
        """One tool call answered with ``code`` (``ok`` or an error code)."""

    def due_transaction(self, seconds: float) -> None:
        """One agent's due transaction (a wake) took ``seconds``."""

    def wake(self, outcome: str) -> None:
        """One wake ended with ``outcome`` (a ``WakeOutcome`` value)."""

    def dispatched(self, kind: str, lateness_s: float) -> None:
        """A dispatch (``one-shot`` or ``batch``) was written; its followup went out
        ``lateness_s`` after the earliest occurrence it carries."""

    def delivery(self, outcome: str, count: int = 1) -> None:
        """Followups ``delivered`` into a session, ``dropped`` by the delivery gate, or
        ``reprojected`` from the log."""

    def session_lateness(self, lateness_s: float) -> None:
        """A delivered message was appended ``lateness_s`` after its earliest occurrence."""

    def redis_error(self) -> None:
        """A Redis command failed (a connection or timeout error, or any Redis error a
        transaction caught)."""

    def pass_done(self, loop: str, at_s: float) -> None:
        """A pass of ``loop`` (``mover``, ``reconcile``, ``lease_renewal``) ended at
        ``at_s`` (epoch seconds)."""

    def live_agents(self, count: int) -> None:
        """Agents with a valid lease, as the last rebuild or reconcile pass found them."""

    def scheduled_wakes(self, count: int) -> None:
        """Entries in the wake schedule, as the last rebuild or reconcile pass found them."""

    def clock_skew(self, seconds: float) -> None:
        """This process's wall clock minus Redis's, at its last measurement."""

    def followups_pending(self, count: int) -> None:
        """Followup entries in live agents' streams, as the last reconcile pass found them."""

    def load_requested(self) -> None:
        """The scheduler asked a host group to load an unloaded session whose timer is due."""

    def load_request(self, outcome: str, seconds: float) -> None:
        """A host answered a load request ``seconds`` after it was announced: ``loaded``,
        ``declined`` (the callback loaded nothing), ``failed`` (it raised), ``live`` (a
        live host serves it) or ``taken`` (another host claimed it)."""


def lateness_s(now_ms: int, occurrences: Sequence[str]) -> float:
    """Seconds from the earliest of ``occurrences`` (canonical instants) to ``now_ms``,
    never below zero (a clock behind the occurrence's counts as on time). A value that is
    no instant is left out; with none left, zero: measuring never fails a transaction."""
    instants: list[int] = []
    for at in occurrences:
        try:
            instants.append(parse_instant(at))
        except ValueError:
            continue
    if not instants:
        return 0.0
    return max(now_ms - min(instants), 0) / 1000


class PrometheusMetrics(Metrics):
    """Records into a prometheus-client registry (its own unless one is given).

    ``dsh_schedule_redis_errors_total`` exists from the start (at zero); every other
    metric appears once its process first records it, so no process exports one it does
    not measure."""

    enabled = True

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        from prometheus_client import CollectorRegistry, Counter

        if registry is None:
            registry = CollectorRegistry()
            _process_collectors(registry)
        self.registry = registry
        self._lock = threading.Lock()
        self._made: dict[str, Any] = {}
        self._redis_errors = Counter(
            "dsh_schedule_redis_errors", "Redis commands that failed.", registry=registry,
        )

    def tool_call(self, tool: str, code: str, seconds: float) -> None:
        tool = tool if tool in TOOLS else "unknown"
        self._metric("tool_seconds").labels(tool).observe(seconds)
        self._metric("tool_calls").labels(tool, code).inc()

    def due_transaction(self, seconds: float) -> None:
        self._metric("due_seconds").observe(seconds)

    def wake(self, outcome: str) -> None:
        self._metric("wakes").labels(outcome).inc()

    def dispatched(self, kind: str, lateness_s: float) -> None:
        self._metric("dispatches").labels(kind).inc()
        self._metric("lateness").labels("followup").observe(lateness_s)

    def delivery(self, outcome: str, count: int = 1) -> None:
        self._metric("deliveries").labels(outcome).inc(count)

    def session_lateness(self, lateness_s: float) -> None:
        self._metric("lateness").labels("session").observe(lateness_s)

    def redis_error(self) -> None:
        self._redis_errors.inc()

    def pass_done(self, loop: str, at_s: float) -> None:
        self._metric("last_pass").labels(loop).set(at_s)

    def live_agents(self, count: int) -> None:
        self._metric("live_agents").set(count)

    def scheduled_wakes(self, count: int) -> None:
        self._metric("scheduled_wakes").set(count)

    def followups_pending(self, count: int) -> None:
        self._metric("followups_pending").set(count)

    def load_requested(self) -> None:
        self._metric("load_requests").inc()

    def load_request(self, outcome: str, seconds: float) -> None:
        self._metric("load_answers").labels(outcome).inc()
        if outcome == "loaded":
            self._metric("load_seconds").observe(seconds)

    def clock_skew(self, seconds: float) -> None:
        self._metric("clock_skew").set(seconds)

    def _metric(self, key: str) -> Any:
        metric = self._made.get(key)
        if metric is None:
            with self._lock:
                metric = self._made.get(key)
                if metric is None:
                    metric = _DEFINITIONS[key](self.registry)
                    self._made[key] = metric
        return metric


def _definitions() -> dict[str, Callable[[CollectorRegistry], Any]]:
    """How each metric is made, by key; prometheus-client is imported when one is."""

    def histogram(name: str, doc: str, labels: Sequence[str],
                  buckets: Sequence[float]) -> Callable[[CollectorRegistry], Any]:
        def make(registry: CollectorRegistry) -> Any:
            from prometheus_client import Histogram

            return Histogram(name, doc, list(labels), buckets=buckets, registry=registry)

        return make

    def counter(name: str, doc: str, labels: Sequence[str]) -> Callable[[CollectorRegistry], Any]:
        def make(registry: CollectorRegistry) -> Any:
            from prometheus_client import Counter

            return Counter(name, doc, list(labels), registry=registry)

        return make

    def gauge(name: str, doc: str, labels: Sequence[str] = ()) -> Callable[
            [CollectorRegistry], Any]:
        def make(registry: CollectorRegistry) -> Any:
            from prometheus_client import Gauge

            return Gauge(name, doc, list(labels), registry=registry)

        return make

    return {
        "lateness": histogram(
            "dsh_schedule_lateness_seconds",
            "Seconds from a reminder's occurrence to its followup being written (stage "
            "followup, worker) or to its message being appended to the session (stage "
            "session, host); one observation per followup or message, at its earliest "
            "occurrence.",
            ["stage"], LATENESS_BUCKETS,
        ),
        "tool_seconds": histogram(
            "dsh_schedule_tool_call_seconds", "Duration of one Schedule tool call.",
            ["tool"], DURATION_BUCKETS,
        ),
        "due_seconds": histogram(
            "dsh_schedule_due_transaction_seconds",
            "Duration of one agent's due transaction (one wake).", [], DURATION_BUCKETS,
        ),
        "dispatches": counter(
            "dsh_schedule_dispatches", "Dispatches written, by kind (one-shot, batch).",
            ["kind"],
        ),
        "tool_calls": counter(
            "dsh_schedule_tool_calls",
            "Schedule tool calls, by tool and answer code (ok or the error code).",
            ["tool", "code"],
        ),
        "wakes": counter(
            "dsh_schedule_wakes", "Wakes, by how they ended (the WakeOutcome value).",
            ["outcome"],
        ),
        "deliveries": counter(
            "dsh_schedule_deliveries",
            "Followups delivered into a session, dropped by the delivery gate, or "
            "re-projected from the log.",
            ["outcome"],
        ),
        "last_pass": gauge(
            "dsh_schedule_last_pass_timestamp_seconds",
            "When a loop (mover, reconcile, lease_renewal) last finished a pass, in epoch "
            "seconds.",
            ["loop"],
        ),
        "live_agents": gauge(
            "dsh_schedule_live_agents",
            "Agents with a valid lease, at the last rebuild or reconcile pass.",
        ),
        "scheduled_wakes": gauge(
            "dsh_schedule_scheduled_wakes",
            "Entries in the wake schedule, at the last rebuild or reconcile pass.",
        ),
        "clock_skew": gauge(
            "dsh_schedule_clock_skew_seconds",
            "This process's wall clock minus Redis's clock, at its last measurement; "
            "every decision about time reads Redis's clock.",
        ),
        "load_requests": counter(
            "dsh_schedule_load_requests",
            "Load requests the scheduler announced for unloaded sessions whose timer fell "
            "due.", [],
        ),
        "load_answers": counter(
            "dsh_schedule_load_answers",
            "Load requests a host answered, by outcome (loaded, declined, failed, live, "
            "taken).", ["outcome"],
        ),
        "load_seconds": histogram(
            "dsh_schedule_load_seconds",
            "Seconds from a load request's announcement to the session loaded.", [],
            LATENESS_BUCKETS,
        ),
        "followups_pending": gauge(
            "dsh_schedule_followups_pending",
            "Followup entries in live agents' streams, at the last reconcile pass.",
        ),
    }


_DEFINITIONS: Final = _definitions()


def _process_collectors(registry: CollectorRegistry) -> None:
    """The process's CPU, memory and file descriptors, and the Python version, as
    prometheus-client's default registry would export them."""
    from prometheus_client import PlatformCollector, ProcessCollector

    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)


_OFF: Final = Metrics()
_current: Metrics = _OFF


def get() -> Metrics:
    """The process's recorder: a Prometheus one once ``enable`` ran, else one that does
    nothing."""
    return _current


def enable(registry: CollectorRegistry | None = None) -> PrometheusMetrics:
    """Record from now on, into ``registry`` (a host exporting its own metrics passes its
    registry, e.g. prometheus-client's default ``REGISTRY``) or a new one of our own."""
    global _current
    recorder = PrometheusMetrics(registry)
    _current = recorder
    return recorder


def disable() -> None:
    """Record nothing from now on (tests; a host that stops exporting)."""
    global _current
    _current = _OFF


class MetricsServer:
    """The HTTP endpoint serving ``/metrics``; ``close`` stops it."""

    def __init__(self, recorder: PrometheusMetrics, server: Any, port: int) -> None:
        self.recorder = recorder
        self.port = port
        self._server = server

    def close(self) -> None:
        """Stop serving and free the port. For a host that serves metrics for less than
        its whole life (``metrics.serve`` is its API, docs/host-integration.md) and for
        tests; the CLI's processes serve until they exit, so they never call it."""
        self._server.shutdown()
        self._server.server_close()


def serve(port: int, addr: str = "0.0.0.0") -> MetricsServer:
    """Enable metrics and serve them at ``http://addr:port/metrics`` from a daemon thread;
    OSError when the port cannot be bound."""
    from prometheus_client import disable_created_metrics, start_http_server

    # No ``_created`` series beside each counter and histogram.
    disable_created_metrics()  # type: ignore[no-untyped-call]
    recorder = enable()
    try:
        server, _thread = start_http_server(port, addr=addr, registry=recorder.registry)
    except BaseException:
        disable()
        raise
    return MetricsServer(recorder, server, server.server_address[1])
