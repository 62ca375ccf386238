"""Metrics, structured logs and the health check, in one process
(docs/architecture.md#operations).

The same paths run with real worker, scheduler and host processes in
``test_operations_processes.py``.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import fakeredis
import msgspec
import pytest
import redis

from dsh_schedule import status
from dsh_schedule.cli import main
from dsh_schedule.embedded import EmbeddedSystem
from dsh_schedule.host.tools import ScheduleTools
from dsh_schedule.scheduler.process import Reconciler, rebuild
from dsh_schedule.shared import metrics
from dsh_schedule.shared.coordination.agents import Coordination
from dsh_schedule.shared.logging_setup import (
    JsonFormatter,
    TextFormatter,
    add_log_context,
    configure,
    log_context,
)
from dsh_schedule.shared.settings import LogSettings, Settings, SettingsError
from dsh_schedule.shared.store.memory import MemoryStore
from dsh_schedule.worker.due import WakeOutcome
from tests.support import FakeClock, add_followup, new_session, reminder_texts


@pytest.fixture
def recorder() -> Iterator[metrics.PrometheusMetrics]:
    enabled = metrics.enable()
    try:
        yield enabled
    finally:
        metrics.disable()


def sample(recorder: metrics.PrometheusMetrics, name: str, **labels: str) -> float:
    """A sample's value; 0 when the series does not exist (yet)."""
    found = recorder.registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def system(redis_client: redis.Redis, settings: Settings, clock: FakeClock) -> EmbeddedSystem:
    return EmbeddedSystem(
        MemoryStore(), settings, clock=clock, sleep=clock.advance, client=redis_client,
        injected_clock=True,
    )


def _call(system: EmbeddedSystem, session: str, tool: str, args: dict[str, Any]) -> Any:
    _definition, handler = system.host.agents[session].tools[tool]
    return handler(args)


# -- metrics ------------------------------------------------------------------------------


def test_metrics_are_off_by_default_and_record_nothing() -> None:
    off = metrics.get()
    assert off.enabled is False
    assert type(off) is metrics.Metrics
    off.tool_call("schedule_create", "ok", 0.1)  # accepted, and does nothing
    assert metrics.lateness_s(0, []) == 0.0


def test_lateness_is_measured_at_the_followup_and_in_the_session(
    system: EmbeddedSystem, clock: FakeClock, recorder: metrics.PrometheusMetrics
) -> None:
    session = new_session(system.store)
    system.host.open_root(session)
    system.step()
    assert not _call(system, session, "schedule_create",
                     {"prompt": "stretch", "after_seconds": 2}).is_error
    clock.advance(5)  # nothing runs until 3 s after the target
    system.step()
    assert len(reminder_texts(system.store, session)) == 1
    followup = {"stage": "followup"}
    in_session = {"stage": "session"}
    assert sample(recorder, "dsh_schedule_lateness_seconds_count", **followup) == 1
    assert sample(recorder, "dsh_schedule_lateness_seconds_sum", **followup) == 3.0
    assert sample(recorder, "dsh_schedule_lateness_seconds_count", **in_session) == 1
    assert sample(recorder, "dsh_schedule_lateness_seconds_sum", **in_session) == 3.0
    # 2.5 s < 3 s <= 5 s: the observation is in the 5 s bucket, not in the 2.5 s one.
    assert sample(recorder, "dsh_schedule_lateness_seconds_bucket", le="2.5", **followup) == 0
    assert sample(recorder, "dsh_schedule_lateness_seconds_bucket", le="5.0", **followup) == 1
    assert sample(recorder, "dsh_schedule_dispatches_total", kind="one-shot") == 1
    assert sample(recorder, "dsh_schedule_dispatches_total", kind="batch") == 0
    assert sample(recorder, "dsh_schedule_deliveries_total", outcome="delivered") == 1
    assert sample(recorder, "dsh_schedule_wakes_total", outcome="settled") >= 2
    wakes = sum(sample(recorder, "dsh_schedule_wakes_total", outcome=o.value)
                for o in WakeOutcome)
    assert sample(recorder, "dsh_schedule_due_transaction_seconds_count") == wakes
    assert sample(recorder, "dsh_schedule_last_pass_timestamp_seconds",
                  loop="lease_renewal") > 0


def test_a_recurring_batch_counts_as_one_batch_dispatch(
    system: EmbeddedSystem, clock: FakeClock, recorder: metrics.PrometheusMetrics
) -> None:
    session = new_session(system.store)
    system.host.open_root(session)
    system.step()
    for prompt in ("a", "b"):
        assert not _call(system, session, "schedule_create",
                         {"prompt": prompt, "every_seconds": 300}).is_error
    clock.advance(301)
    system.step()
    assert len(reminder_texts(system.store, session)) == 1
    assert sample(recorder, "dsh_schedule_dispatches_total", kind="batch") == 1
    assert sample(recorder, "dsh_schedule_dispatches_total", kind="one-shot") == 0
    assert sample(recorder, "dsh_schedule_lateness_seconds_count", stage="followup") == 1
    assert sample(recorder, "dsh_schedule_lateness_seconds_sum", stage="followup") == 1.0


def test_a_lost_followup_counts_as_reprojected_and_a_stray_one_as_dropped(
    system: EmbeddedSystem, clock: FakeClock, recorder: metrics.PrometheusMetrics
) -> None:
    session = new_session(system.store)
    system.host.open_root(session)
    system.step()
    _call(system, session, "schedule_create", {"prompt": "x", "after_seconds": 2})
    clock.advance(3)
    system.coordination.wakes.move_due(clock())
    system.worker.work(burst=True, logging_level="WARNING")  # dispatched, not delivered
    assert sample(recorder, "dsh_schedule_dispatches_total", kind="one-shot") == 1
    system.coordination.followups.drop([session])  # the followup is lost from Redis
    system.coordination.trigger([session])  # its next wake re-projects it from the log
    system.worker.work(burst=True, logging_level="WARNING")
    add_followup(system.coordination.followups, session, "stray", [])  # no dispatch covers this
    system.step()
    assert len(reminder_texts(system.store, session)) == 1
    assert sample(recorder, "dsh_schedule_deliveries_total", outcome="reprojected") == 1
    assert sample(recorder, "dsh_schedule_deliveries_total", outcome="dropped") == 1
    assert sample(recorder, "dsh_schedule_deliveries_total", outcome="delivered") == 1


def test_tool_calls_are_counted_by_tool_and_code(
    coordination: Coordination, settings: Settings, recorder: metrics.PrometheusMetrics
) -> None:
    store = MemoryStore()
    session = new_session(store)
    tools = ScheduleTools(store, coordination, settings, FakeClock())
    tools.call(session, "schedule_create", {"prompt": "a", "after_seconds": 60})
    tools.call(session, "schedule_create", {"prompt": "", "after_seconds": 60})
    tools.call(session, "schedule_list", {})
    tools.call(session, "schedule_delete", {"id": "schedule-9"})  # not found is an answer
    tools.call(session, "schedule_frobnicate", {})
    calls = "dsh_schedule_tool_calls_total"
    assert sample(recorder, calls, tool="schedule_create", code="ok") == 1
    assert sample(recorder, calls, tool="schedule_create", code="invalid_prompt") == 1
    assert sample(recorder, calls, tool="schedule_list", code="ok") == 1
    assert sample(recorder, calls, tool="schedule_delete", code="ok") == 1
    assert sample(recorder, calls, tool="unknown", code="invalid_selector") == 1
    assert sample(recorder, "dsh_schedule_tool_call_seconds_count", tool="schedule_create") == 2


def test_a_redis_error_in_a_tool_call_is_counted(
    settings: Settings, recorder: metrics.PrometheusMetrics
) -> None:
    server = fakeredis.FakeServer()
    server.connected = False  # every command fails with a ConnectionError
    client = fakeredis.FakeRedis(server=server)
    store = MemoryStore()
    session = new_session(store)
    tools = ScheduleTools(store, Coordination(client, settings), settings, FakeClock())
    result = tools.call(session, "schedule_list", {})
    assert result.is_error
    assert sample(recorder, "dsh_schedule_redis_errors_total") == 1
    assert sample(recorder, "dsh_schedule_tool_calls_total", tool="schedule_list",
                  code="internal_error") == 1


def test_the_reconcile_pass_sets_the_gauges(
    system: EmbeddedSystem, clock: FakeClock, settings: Settings,
    recorder: metrics.PrometheusMetrics,
) -> None:
    for session in ("s1", "s2", "s3"):
        new_session(system.store, session)
        system.host.open_root(session)
    system.step()
    _call(system, "s1", "schedule_create", {"prompt": "later", "after_seconds": 600})
    _call(system, "s2", "schedule_create", {"prompt": "now", "after_seconds": 1})
    clock.advance(2)
    system.coordination.wakes.move_due(clock())
    system.worker.work(burst=True, logging_level="WARNING")  # s2 dispatched, not delivered
    add_followup(system.coordination.followups, "s2", "stray", [])
    add_followup(system.coordination.followups, "s3", "stray", [])
    reconciler = Reconciler(system.coordination, settings)
    reconciler.reconcile(now_ms=clock())
    assert sample(recorder, "dsh_schedule_live_agents") == 3
    assert sample(recorder, "dsh_schedule_scheduled_wakes") == 1  # s1's
    assert sample(recorder, "dsh_schedule_followups_pending") == 3  # entries, not streams
    summary = msgspec.json.decode(
        system.client.get(system.coordination.keys.scheduler_reconcile()),
        type=status.ReconcileSummary,
    )
    assert (summary.kind, summary.live, summary.at) == ("reconcile", 3, clock())
    system.host.close()  # disposal forgets every agent in Redis
    reconciler.reconcile(now_ms=clock())
    assert sample(recorder, "dsh_schedule_live_agents") == 0
    assert sample(recorder, "dsh_schedule_scheduled_wakes") == 0
    assert sample(recorder, "dsh_schedule_followups_pending") == 0


def test_metrics_are_served_over_http(recorder: metrics.PrometheusMetrics) -> None:
    import urllib.request

    metrics.disable()
    server = metrics.serve(0, "127.0.0.1")
    try:
        metrics.get().wake("settled")
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics",
                                    timeout=10) as response:
            text = response.read().decode()
    finally:
        server.close()
    assert 'dsh_schedule_wakes_total{outcome="settled"} 1.0' in text
    assert "dsh_schedule_redis_errors_total 0.0" in text
    assert "_created" not in text
    assert "dsh_schedule_live_agents" not in text  # only the scheduler sets it


# -- logs ---------------------------------------------------------------------------------


def _record(message: str, *, exc: bool = False) -> logging.LogRecord:
    record = logging.LogRecord("dsh_schedule.test", logging.WARNING, __file__, 1, message,
                               None, None)
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            import sys

            record.exc_info = sys.exc_info()
    return record


def test_json_lines_carry_the_context_of_their_block() -> None:
    formatter = JsonFormatter()
    with log_context(agent="s1", wake_id="job-1"):
        add_log_context(schedule_id="schedule-2")
        inside = json.loads(formatter.format(_record("inside")))
        with log_context(agent=None):
            nested = json.loads(formatter.format(_record("nested", exc=True)))
    outside = json.loads(formatter.format(_record("outside")))
    assert inside["message"] == "inside"
    assert inside["level"] == "WARNING"
    assert inside["logger"] == "dsh_schedule.test"
    assert inside["time"].endswith("Z") and len(inside["time"]) == 24
    assert (inside["agent"], inside["schedule_id"], inside["wake_id"]) == (
        "s1", "schedule-2", "job-1"
    )
    assert nested["agent"] == "s1"  # None leaves the enclosing value
    assert "ValueError: boom" in nested["exception"]
    assert "agent" not in outside and "exception" not in outside


def test_text_lines_name_the_context_at_their_end() -> None:
    formatter = TextFormatter()
    with log_context(agent="s1"):
        line = formatter.format(_record("hello there"))
    assert line.endswith("WARNING dsh_schedule.test: hello there [agent=s1]")
    assert formatter.format(_record("plain")).endswith("dsh_schedule.test: plain")


def _record_at(created: float) -> logging.LogRecord:
    record = _record("at")
    record.created = created
    record.msecs = int((created - int(created)) * 1000) + 0.0  # as LogRecord computes it
    return record


# Within one second, across seconds and back (the time a formatter renders each second's
# text once for), including the last millisecond of a second.
_CREATED = (1764581400.0, 1764581400.999, 1764581401.0005, 1764581400.5, 1e9 + 0.25,
            1764581401.4)


def test_text_lines_keep_loggings_own_time() -> None:
    ours, stock = TextFormatter(), logging.Formatter()
    for created in _CREATED:
        record = _record_at(created)
        assert ours.formatTime(record) == stock.formatTime(record), created


def test_json_lines_give_the_utc_time_to_the_millisecond() -> None:
    formatter = JsonFormatter()
    for created in _CREATED:
        record = _record_at(created)
        stamp = datetime.fromtimestamp(int(created), UTC)
        expected = stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{int(record.msecs):03d}Z"
        assert json.loads(formatter.format(record))["time"] == expected, created


def test_a_json_line_is_one_compact_object_even_with_a_lone_surrogate() -> None:
    formatter = JsonFormatter()
    with log_context(agent="s\u00e9"):
        plain = formatter.format(_record("caf\u00e9"))
        odd = formatter.format(_record("name b'\\x80' as \udc80"))
    assert plain.startswith('{"time":"') and '","level":"WARNING","logger":' in plain
    assert json.loads(plain)["message"] == "caf\u00e9"
    assert json.loads(plain)["agent"] == "s\u00e9"  # not \u-escaped: UTF-8 as it is
    assert "\u00e9" in plain
    assert json.loads(odd)["message"] == "name b'\\x80' as \udc80"
    assert '","level":"WARNING",' in odd


def test_configured_lines_are_made_without_looking_up_their_caller(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def caller(*args: object, **kwargs: object) -> tuple[str, int, str, None]:
        raise AssertionError("a configured line looked up its caller")

    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    for knob in ("_srcfile", "logThreads", "logProcesses", "logMultiprocessing"):
        monkeypatch.setattr(logging, knob, getattr(logging, knob))  # restored after
    monkeypatch.setattr(logging.Logger, "findCaller", caller)
    try:
        configure(LogSettings(format="text", level="INFO"), stream=stream)
        with log_context(agent="s1"):
            logging.getLogger("dsh_schedule.worker.dispatch").info("dispatched %s", "x")
    finally:
        for handler in list(root.handlers):
            if type(handler).__name__ == "_Handler":
                root.removeHandler(handler)
        root.setLevel(level)
    assert stream.getvalue().endswith(
        " INFO dsh_schedule.worker.dispatch: dispatched x [agent=s1]\n")


def test_rq_lines_get_their_own_level() -> None:
    stream = io.StringIO()
    root = logging.getLogger()
    level = root.level
    try:
        configure(LogSettings(format="json", level="INFO", rq_level="WARNING"), stream=stream)
        logging.getLogger("rq.worker").info("Job OK (quiet)")
        logging.getLogger("rq.worker").warning("rq warns")
        logging.getLogger("dsh_schedule.worker.due").info("ours")
    finally:
        configure(LogSettings(), stream=io.StringIO())
        for handler in list(root.handlers):
            if type(handler).__name__ == "_Handler":
                root.removeHandler(handler)
        root.setLevel(level)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["logger"], line["message"]) for line in lines] == [
        ("rq.worker", "rq warns"), ("dsh_schedule.worker.due", "ours"),
    ]


def test_log_settings_come_from_flags_over_the_environment() -> None:
    env = {"DSH_SCHEDULE_LOG_FORMAT": "JSON", "DSH_SCHEDULE_LOG_LEVEL": "warn",
           "DSH_SCHEDULE_RQ_LOG_LEVEL": "error"}
    assert LogSettings.from_env(env) == LogSettings(format="json", level="WARNING",
                                                    rq_level="ERROR")
    assert LogSettings.from_env(env, format="text", level="DEBUG") == LogSettings(
        format="text", level="DEBUG", rq_level="ERROR")
    assert LogSettings.from_env({}) == LogSettings()
    with pytest.raises(SettingsError, match="log format"):
        LogSettings.from_env({"DSH_SCHEDULE_LOG_FORMAT": "yaml"})
    with pytest.raises(SettingsError, match="log level"):
        LogSettings.from_env({"DSH_SCHEDULE_LOG_LEVEL": "loud"})


def test_the_metrics_port_is_a_tcp_port() -> None:
    assert Settings.from_env({"DSH_SCHEDULE_METRICS_PORT": "9460"}).metrics_port == 9460
    assert Settings.from_env({}).metrics_port is None
    for bad in ("0", "65536", "x", "-1"):
        with pytest.raises(SettingsError, match="metrics_port"):
            Settings.from_env({"DSH_SCHEDULE_METRICS_PORT": bad})


@pytest.mark.parametrize(("argv", "env", "needle"), [
    (["worker", "--log-format", "yaml"], {}, "invalid choice"),
    (["scheduler", "--log-level", "loud"], {}, "is not a log level"),
    (["catalog"], {"DSH_SCHEDULE_LOG_FORMAT": "yaml"}, "bad setting: log format"),
    (["worker", "--metrics-port", "70000", "--redis", "redis://127.0.0.1:1/0"], {},
     "metrics_port"),
])
def test_bad_logging_and_metrics_settings_are_one_line_and_exit_2(
    argv: list[str], env: dict[str, str], needle: str,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        code = main(argv)
    except SystemExit as exit:
        code = exit.code  # argparse's own errors
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert needle in err


# -- health in one process -----------------------------------------------------------------


def test_plugin_health_needs_a_scheduler_heartbeat_and_a_worker(
    system: EmbeddedSystem, clock: FakeClock
) -> None:
    plugin = system.host.plugin
    health = plugin.health()
    assert not health.ok
    assert "no scheduler heartbeat" in health.reason
    status.write_heartbeat(system.client, system.coordination.keys, every_s=1.0,
                           now_ms=clock())
    health = plugin.health()
    assert not health.ok
    assert health.reason == f"queue {system.settings.queue!r} has no worker"


def test_plugin_health_says_when_redis_is_gone(settings: Settings) -> None:
    server = fakeredis.FakeServer()
    server.connected = False
    client = fakeredis.FakeRedis(server=server)
    from dsh_schedule.host.plugin import SchedulePlugin

    plugin = SchedulePlugin(store=MemoryStore(), coordination=Coordination(client, settings),
                            settings=settings)
    health = plugin.health()
    assert health == status.Health(ok=False, reason="Redis unavailable (ConnectionError)")


def test_a_rebuild_batch_counts_each_agent_wake_and_its_duration(
    system: EmbeddedSystem, recorder: metrics.PrometheusMetrics
) -> None:
    for session in ("s1", "s2"):
        new_session(system.store, session)
        system.host.open_root(session)
    system.step()
    before = {o: sample(recorder, "dsh_schedule_wakes_total", outcome=o.value)
              for o in WakeOutcome}
    durations = sample(recorder, "dsh_schedule_due_transaction_seconds_count")
    system.host.plugin.renew_leases()
    # one immediate wake_batch job for both agents
    rebuild(system.coordination, system.settings, now_ms=system.clock())
    system.worker.work(burst=True, logging_level="WARNING")
    after = {o: sample(recorder, "dsh_schedule_wakes_total", outcome=o.value)
             for o in WakeOutcome}
    assert after[WakeOutcome.SETTLED] - before[WakeOutcome.SETTLED] == 2
    assert sum(after.values()) - sum(before.values()) == 2
    assert sample(recorder, "dsh_schedule_due_transaction_seconds_count") - durations == 2
