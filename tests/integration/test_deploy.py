"""The deployment files (deploy/README.md): the Procfile run by honcho against a real Redis
delivers a reminder; the Procfile's lines, the image (Dockerfile, .dockerignore), the
compose file, the systemd units and the Prometheus configuration are checked for what a
first deployment needs.

Docker builds cannot run in the test suite. The compose and Prometheus files are read by
PyYAML (the test extra), refusing what YAML 1.1 and 1.2 readers read differently;
``docker compose config`` and ``promtool`` check them too where those tools are installed.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from dsh_schedule.shared.settings import environment_names
from tests.conftest import REAL_REDIS_URL

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent
IMAGE = "dsh-tool-schedule:latest"
# The metrics the alert rules may read: the operations issue's list.
KNOWN_METRICS = {
    "dsh_schedule_lateness_seconds",
    "dsh_schedule_redis_errors_total",
    "dsh_schedule_followups_pending",
    "dsh_schedule_last_pass_timestamp_seconds",
}
HISTOGRAMS = {"dsh_schedule_lateness_seconds"}


# -- the YAML of the deployment files -----------------------------------------------------


def _ambiguous_scalars(node: yaml.Node) -> list[str]:
    """Plain scalars a YAML 1.1 reader (PyYAML; Go's yaml.v2, which Prometheus uses) reads
    otherwise than a YAML 1.2 one (docker compose): a yes/no/on/off boolean, a leading-zero
    octal, a base-60 number."""
    if isinstance(node, yaml.ScalarNode):
        value = node.value
        plain = node.style is None
        if plain and node.tag == "tag:yaml.org,2002:bool" and value.lower() not in (
                "true", "false"):
            return [f"line {node.start_mark.line + 1}: {value!r} (a boolean in YAML 1.1)"]
        if plain and node.tag in ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float") and (
                ":" in value or re.fullmatch(r"[-+]?0[0-9_]+", value)):
            return [f"line {node.start_mark.line + 1}: {value!r} (a number in YAML 1.1 only)"]
        return []
    if isinstance(node, yaml.SequenceNode):
        return [found for item in node.value for found in _ambiguous_scalars(item)]
    if isinstance(node, yaml.MappingNode):
        return [found for pair in node.value for part in pair
                for found in _ambiguous_scalars(part)]
    return []


def read_yaml(path: Path) -> Any:
    """``path`` read by PyYAML, refusing what YAML 1.1 and 1.2 readers read differently."""
    text = path.read_text(encoding="utf-8")
    node = yaml.compose(text, Loader=yaml.SafeLoader)
    ambiguous = [] if node is None else _ambiguous_scalars(node)
    assert not ambiguous, f"{path}: quote {'; '.join(ambiguous)}"
    return yaml.safe_load(text)


@pytest.mark.parametrize("text", ["a: yes", "a: [on]", "b:\n  c: 0750", "d: 1:30"])
def test_yaml_a_1_1_reader_reads_otherwise_is_refused(text: str, tmp_path: Path) -> None:
    # given a file with a plain scalar YAML 1.1 and 1.2 readers disagree on
    path = tmp_path / "x.yml"
    path.write_text(text, encoding="utf-8")
    # when it is read, then it is refused, naming the line
    with pytest.raises(AssertionError, match="line"):
        read_yaml(path)


def test_yaml_quoted_and_plain_scalars_that_agree_are_read() -> None:
    assert yaml.safe_load('a: "yes"\nb: true\nc: 9460\nd: "0750"') == {
        "a": "yes", "b": True, "c": 9460, "d": "0750"}


# -- the Procfile -----------------------------------------------------------------------


def _delivered(log: Path) -> list[dict[str, object]]:
    found = []
    for line in log.read_text(encoding="utf-8").splitlines()[1:]:
        event = json.loads(line)
        source = event["data"].get("source", {}) if isinstance(event["data"], dict) else {}
        if event["type"] == "user/message" and source.get("plugin") == "tool-schedule":
            found.append(event)
    return found


def _clean_env() -> dict[str, str]:
    """This environment without DSH_SCHEDULE_* settings (the test Redis's name stays)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("DSH_SCHEDULE_") or k == "DSH_SCHEDULE_TEST_REDIS"}


def _procfile() -> dict[str, str]:
    lines = (DEPLOY / "Procfile").read_text(encoding="utf-8").splitlines()
    found = (re.match(r"^([A-Za-z0-9_-]+):\s*(.+)$", line) for line in lines)
    return {m[1]: m[2] for m in found if m}


@pytest.mark.redis
@pytest.mark.slow
def test_procfile_runs_worker_scheduler_and_host(tmp_path: Path, real_redis: redis.Redis) -> None:
    """The host line creates the session it serves that does not exist yet (deploy-s1)
    beside one that does (deploy-s0), and a reminder created with ``dsh-schedule call`` is
    delivered into the new one."""
    sessions = tmp_path / "sessions"
    env = dict(
        _clean_env(),
        PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        DSH_SCHEDULE_REDIS_URL=REAL_REDIS_URL,
        DSH_SCHEDULE_SESSIONS=str(sessions),
        DSH_SCHEDULE_PREFIX="honcho-test:",
        DSH_SCHEDULE_QUEUE="honcho-test",
        DSH_SCHEDULE_HOST_SESSIONS="deploy-s0 deploy-s1",
    )
    cli = [sys.executable, "-m", "dsh_schedule"]
    subprocess.run([*cli, "session", "create", "deploy-s0"], env=env, check=True,
                   capture_output=True)
    honcho = subprocess.Popen(
        [str(BIN / "honcho"), "start", "-f", str(DEPLOY / "Procfile"), "-d", str(ROOT)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 20
        while not all(real_redis.hget("honcho-test:agent-host", s) for s in ("deploy-s0",
                                                                          "deploy-s1")):
            assert honcho.poll() is None, "honcho stopped"
            assert time.monotonic() < deadline, "the host never took its leases"
            time.sleep(0.1)
        created = subprocess.run(
            [*cli, "call", "deploy-s1", "schedule_create",
             '{"prompt":"deployed","after_seconds":2}'],
            env=env, capture_output=True, text=True, check=True,
        )
        assert json.loads(created.stdout)["id"] == "schedule-1"
        log = sessions / "deploy-s1.jsonl"
        deadline = time.monotonic() + 30
        while not _delivered(log):
            assert time.monotonic() < deadline, "the reminder was not delivered"
            time.sleep(0.2)
        time.sleep(1.0)
        delivered = _delivered(log)
        assert len(delivered) == 1
        assert 'reminder_prompt_json: "deployed"' in delivered[0]["data"]["content"][0]["text"]
        assert _delivered(sessions / "deploy-s0.jsonl") == []
    finally:
        os.killpg(honcho.pid, signal.SIGTERM)
        try:
            honcho.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(honcho.pid, signal.SIGKILL)
            honcho.wait()
        assert honcho.stdout is not None
        honcho.stdout.close()


def test_procfile_lines_create_missing_sessions_and_give_each_process_its_metrics_port(
        tmp_path: Path) -> None:
    """Each line run as honcho runs it (``sh -c`` with ``$PORT``), against a stand-in
    ``dsh-schedule`` that records its arguments and metrics port."""
    stub_bin = tmp_path / "bin"
    stub_bin.mkdir()
    calls = tmp_path / "calls"
    stub = stub_bin / "dsh-schedule"
    stub.write_text(
        "#!/bin/sh\n"
        f'echo "${{DSH_SCHEDULE_METRICS_PORT-unset}} $*" >> "{calls}"\n'
        'if [ "$1" = session ]; then : > "$DSH_SCHEDULE_SESSIONS/$3.jsonl"; fi\n',
        encoding="utf-8",
    )
    stub.chmod(0o755)
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    (sessions / "old.jsonl").write_text("", encoding="utf-8")
    lines = _procfile()
    assert set(lines) == {"worker", "scheduler", "host"}

    def run(name: str, port: int, **extra: str) -> list[str]:
        calls.write_text("", encoding="utf-8")
        env = dict(_clean_env(), PATH=f"{stub_bin}{os.pathsep}{os.environ['PATH']}",
                   PORT=str(port), DSH_SCHEDULE_SESSIONS=str(sessions),
                   DSH_SCHEDULE_HOST_SESSIONS="old new", **extra)
        subprocess.run(["/bin/sh", "-c", lines[name]], env=env, check=True, timeout=30)
        return calls.read_text(encoding="utf-8").splitlines()

    assert run("worker", 5000) == ["unset worker"]
    assert run("scheduler", 5100) == ["unset scheduler"]
    assert run("host", 5200) == ["unset session create new", "unset host old new"]
    assert (sessions / "new.jsonl").exists()
    # Both exist now: nothing is created again.
    assert run("host", 5200) == ["unset host old new"]
    # With metrics asked for, each process takes the port honcho hands it.
    on = {"DSH_SCHEDULE_METRICS_PORT": "9460"}
    assert run("worker", 5001, **on) == ["5001 worker"]
    assert run("scheduler", 5100, **on) == ["5100 scheduler"]
    assert run("host", 5200, **on) == ["5200 host old new"]


# -- the image --------------------------------------------------------------------------


def _dockerignore_patterns() -> list[re.Pattern[str]]:
    patterns = []
    for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("!"), "exceptions are not modelled by this test"
        regex = ""
        for part in re.split(r"(\*\*/|\*\*|\*|\?)", line.strip("/")):
            regex += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(
                part, re.escape(part))
        patterns.append(re.compile(regex))
    return patterns


def in_build_context(relative: str, patterns: list[re.Pattern[str]]) -> bool:
    """Whether the path (relative to the repository, '/'-separated) is sent to the Docker
    build: neither it nor a folder above it matches a .dockerignore pattern."""
    parts = relative.split("/")
    prefixes = ("/".join(parts[: n + 1]) for n in range(len(parts)))
    return not any(p.fullmatch(prefix) for prefix in prefixes for p in patterns)


def test_dockerignore_sends_the_source_and_not_the_checkout_s_debris() -> None:
    patterns = _dockerignore_patterns()
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                             check=True).stdout.split()
    needed = ["pyproject.toml", "README.md"] + [
        path for path in tracked
        if path.split("/")[0] in ("dsh_schedule", "shared", "worker", "scheduler")
    ]
    assert {"shared", "dsh_schedule/shared/settings.py", "dsh_schedule/worker/process.py",
            "dsh_schedule/scheduler/process.py"} <= set(needed)
    for path in needed:
        assert in_build_context(path, patterns), f"{path} is left out of the build context"
    for lock in ("requirements.lock", "constraints.txt"):
        assert in_build_context(lock, patterns)
    for debris in (".venv/bin/python", ".git/HEAD", ".git", "shared/__pycache__/x.pyc",
                   "dsh_schedule/host/__pycache__/reference.cpython-311.pyc",
                   "dsh_tool_schedule.egg-info/PKG-INFO", "build/lib/dsh_schedule/cli.py",
                   "dist/x.whl", ".mypy_cache/3.11/x.json", ".ruff_cache/CACHEDIR.TAG",
                   ".pytest_cache/README.md", ".hypothesis/examples/x",
                   ".import_linter_cache/x", "bench-results/loadtest-1.json", ".env"):
        assert not in_build_context(debris, patterns), f"{debris} is in the build context"


def _dockerfile_stages() -> list[list[tuple[str, str]]]:
    """The instructions of each build stage, as (INSTRUCTION, arguments), continuation
    lines joined."""
    stages: list[list[tuple[str, str]]] = []
    current = ""
    for line in (ROOT / "Dockerfile").read_text(encoding="utf-8").splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if current and line.lstrip().startswith("#"):
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        word, _, args = current.strip().partition(" ")
        current = ""
        if word.upper() == "FROM":
            stages.append([])
        stages[-1].append((word.upper(), " ".join(args.split())))
    return stages


def _sessions_in_image() -> str:
    final = _dockerfile_stages()[-1]
    volumes = [json.loads(args) for word, args in final if word == "VOLUME"]
    assert len(volumes) == 1 and len(volumes[0]) == 1, "one VOLUME: the session directory"
    return str(volumes[0][0])


def test_dockerfile_installs_the_project_for_an_unprivileged_user() -> None:
    stages = _dockerfile_stages()
    build, final = stages[0], stages[-1]
    # The whole context is copied: dsh_schedule/ with its layers, and the links into it.
    assert ("COPY", ". .") in build
    install = next(args for word, args in build if word == "RUN" and "pip install" in args)
    assert re.search(r"pip install \$constraints \"?\.(\[[\w,-]+\])?\"?( |$)", install)
    assert "-e " not in install and "--editable" not in install
    # A lock file is used as constraints whenever the repository has one.
    assert "requirements.lock" in install and "constraints.txt" in install
    assert "--constraint $file" in install

    users = [args for word, args in final if word == "USER"]
    assert users, "the image must not run as root"
    user = users[-1].split(":")[0]
    assert user not in ("root", "0"), users[-1]
    assert user.isdigit(), "a numeric USER lets runtimes check it is not root"
    setup = " ".join(args for word, args in final if word == "RUN")
    assert f"--uid {user}" in setup
    sessions = _sessions_in_image()
    assert f"mkdir -p {sessions}" in setup
    owner = re.search(r"chown -R (\S+):\S+ (\S+)", setup)
    assert owner is not None and sessions.startswith(owner[2])
    env = " ".join(args for word, args in final if word == "ENV")
    assert f"DSH_SCHEDULE_SESSIONS={sessions}" in env
    assert "/opt/dsh-schedule/venv/bin" in env
    assert any(word == "COPY" and args.startswith("--from=") for word, args in final)


def _image_dependencies() -> list[str]:
    """The requirements the image's install takes: the project's dependencies and those of
    every extra its ``pip install`` names (``.[web]``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    dependencies = list(project["dependencies"])
    install = next(args for word, args in _dockerfile_stages()[0]
                   if word == "RUN" and "pip install" in args)
    for extras in re.findall(r"\.\[([\w,-]+)\]", install):
        for extra in extras.split(","):
            dependencies += project.get("optional-dependencies", {}).get(extra, [])
    return dependencies


def _requires(dependencies: list[str], distribution: str) -> bool:
    pattern = re.escape(distribution).replace(r"\-", "[-_]")
    return any(re.match(pattern + r"\b", d, re.IGNORECASE) for d in dependencies)


def test_the_image_installs_what_metrics_need() -> None:
    """The image installs the project's dependencies only, and the compose deployment
    turns metrics on: whatever the package imports for them must be a dependency."""
    source = "\n".join(
        path.read_text(encoding="utf-8")
        for folder in ("dsh_schedule", "shared", "worker", "scheduler")
        for path in sorted((ROOT / folder).rglob("*.py"))
    )
    if not re.search(r"^\s*(?:from|import) prometheus_client\b", source, re.MULTILINE):
        return  # no metrics code yet
    assert _requires(_image_dependencies(), "prometheus-client"), (
        "the metrics import prometheus_client: list prometheus-client in [project] "
        "dependencies (or in an extra the Dockerfile installs), or the image's processes "
        "cannot serve metrics")


def test_the_image_installs_what_the_web_console_needs() -> None:
    """``dsh-schedule web`` runs from the image: every third-party package the console's
    modules import is a requirement of the image's install (the ``web`` extra)."""
    imported: set[str] = set()
    for path in sorted((ROOT / "dsh_schedule" / "web").rglob("*.py")):
        imported.update(re.findall(r"^\s*(?:from|import) (\w+)", path.read_text(encoding="utf-8"),
                                   re.MULTILINE))
    third_party = imported - set(sys.stdlib_module_names) - {"dsh_schedule", "__future__"}
    assert {"fastapi", "uvicorn", "jinja2"} <= third_party, sorted(third_party)
    dependencies = _image_dependencies()
    # starlette and pydantic come with fastapi; the rest must be named.
    missing = [name for name in sorted(third_party - {"starlette", "pydantic"})
               if not _requires(dependencies, name)]
    assert not missing, (f"the web console imports {missing}, which the image does not "
                         "install: add them to the extra the Dockerfile installs")


# -- compose ----------------------------------------------------------------------------


def _compose() -> dict[str, Any]:
    compose = read_yaml(DEPLOY / "docker-compose.yml")
    assert isinstance(compose, dict)
    return compose


def _one_shot(service: dict[str, Any]) -> bool:
    return service.get("restart") == "no"


def test_compose_services_have_healthchecks_ordered_start_and_shared_sessions() -> None:
    compose = _compose()
    services: dict[str, dict[str, Any]] = compose["services"]
    assert {"redis", "session-init", "scheduler", "worker", "host"} <= set(services)
    ours = {name: s for name, s in services.items() if s.get("image") == IMAGE}
    assert set(ours) == {"session-init", "scheduler", "worker", "host"}

    for name, service in services.items():
        if _one_shot(service):
            assert "healthcheck" not in service, name
            continue
        assert service.get("restart") == "unless-stopped", name
        test = service.get("healthcheck", {}).get("test")
        assert isinstance(test, list) and test[0] in ("CMD", "CMD-SHELL"), name
        for dependency, spec in service.get("depends_on", {}).items():
            condition = spec["condition"]
            if condition == "service_healthy":
                assert "healthcheck" in services[dependency], (name, dependency)
            else:
                assert condition == "service_completed_successfully", (name, dependency)
                assert _one_shot(services[dependency]), (name, dependency)
    assert [s for s in services.values() if _one_shot(s)] == [services["session-init"]]

    redis_service = services["redis"]
    assert "redis-cli ping" in " ".join(redis_service["healthcheck"]["test"])
    command = redis_service["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"
    assert any(v.endswith(":/data") for v in redis_service["volumes"])
    for name in ("scheduler", "worker"):
        assert services[name]["healthcheck"]["test"] == ["CMD", "dsh-schedule", "health"]
    assert services["worker"]["deploy"]["replicas"] == 2

    for name in ("scheduler", "worker", "host"):
        assert services[name]["depends_on"]["redis"] == {"condition": "service_healthy"}
        assert services[name]["command"][:2] == ["dsh-schedule", name]
    assert services["host"]["depends_on"]["session-init"] == {
        "condition": "service_completed_successfully"}

    # Host and workers share one session store: the same named volume at the directory
    # their settings name, the image's VOLUME.
    sessions = _sessions_in_image()
    mounts = {}
    for name in ("session-init", "worker", "host"):
        service = services[name]
        assert service["environment"]["DSH_SCHEDULE_SESSIONS"] == sessions, name
        (mount,) = [v for v in service["volumes"] if v.endswith(f":{sessions}")]
        mounts[name] = mount.split(":")[0]
    assert len(set(mounts.values())) == 1
    assert set(mounts.values()) <= set(compose["volumes"])
    env = services["host"]["environment"]
    for name in ("worker", "scheduler"):
        for var in ("DSH_SCHEDULE_REDIS_URL", "DSH_SCHEDULE_PREFIX", "DSH_SCHEDULE_QUEUE"):
            assert services[name]["environment"][var] == env[var], (name, var)
    assert env["DSH_SCHEDULE_REDIS_URL"].startswith("redis://redis:")

    # The host serves the sessions session-init creates, and only after it ran.
    hosted = services["host"]["command"][2:]
    init = " ".join(services["session-init"]["command"])
    for session in hosted:
        assert re.fullmatch(r"[a-z0-9_-]+", session)
        assert f'test -e "$$DSH_SCHEDULE_SESSIONS/{session}.jsonl"' in init
        assert f"dsh-schedule session create {session}" in init
    for service in ours.values():
        assert service["build"]["context"] == ".."
        assert (DEPLOY / service["build"]["context"] / service["build"]["dockerfile"]).is_file()


def _tool_missing(why: str) -> None:
    """A checker this machine lacks: a failure where CI promised it (``.ci/run`` installs
    it and sets DSH_SCHEDULE_CI_TOOLS), a skip on a developer's machine."""
    if os.environ.get("DSH_SCHEDULE_CI_TOOLS"):
        pytest.fail(f"{why}, though .ci/run installs it", pytrace=False)
    pytest.skip(why)


def _compose_command() -> list[str] | None:
    docker = shutil.which("docker")
    if docker is not None and subprocess.run(
            [docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return None if legacy is None else [legacy]


def test_compose_file_validates_with_docker_compose() -> None:
    """``docker compose config`` (or the older ``docker-compose``) needs only the client,
    no engine."""
    compose = _compose_command()
    if compose is None:
        _tool_missing("neither the docker compose plugin nor docker-compose is installed")
        return
    for files in (["docker-compose.yml"], ["docker-compose.yml", "docker-compose.postgres.yml"]):
        named = [arg for name in files for arg in ("-f", str(DEPLOY / name))]
        result = subprocess.run(
            [*compose, *named, "--profile", "monitoring", "config", "--quiet"],
            capture_output=True, text=True, timeout=60, env=_clean_env(),
        )
        assert result.returncode == 0, (files, result.stderr)


def test_the_postgres_overlay_names_one_store_for_the_host_and_the_workers() -> None:
    """Laid over the compose file, the PostgreSQL overlay starts a healthy database first
    and names it as the store of every process that reads sessions."""
    overlay = read_yaml(DEPLOY / "docker-compose.postgres.yml")
    assert isinstance(overlay, dict)
    services: dict[str, dict[str, Any]] = overlay["services"]
    base = _compose()["services"]
    assert "pg_isready" in " ".join(services["postgres"]["healthcheck"]["test"])
    assert set(services) - {"postgres"} <= set(base)
    for name in ("session-init", "worker", "host"):
        store = services[name]["environment"]["DSH_SCHEDULE_STORE"]
        assert store.startswith("postgresql://") and "@postgres:5432/" in store, name
        assert services[name]["depends_on"]["postgres"] == {"condition": "service_healthy"}
    assert "DSH_SCHEDULE_STORE" not in base["scheduler"]["environment"]  # Redis only
    assert "dsh-schedule session create demo" in " ".join(services["session-init"]["command"])
    assert _requires(_image_dependencies(), "psycopg")


# -- systemd ----------------------------------------------------------------------------


def _unit(name: str) -> dict[str, list[str]]:
    entries: dict[str, list[str]] = {}
    for line in (DEPLOY / "systemd" / name).read_text(encoding="utf-8").splitlines():
        if "=" in line and not line.startswith(("#", ";")):
            key, _, value = line.partition("=")
            entries.setdefault(key, []).append(value)
    return entries


def test_systemd_units_share_user_environment_and_install_path() -> None:
    units = {name: _unit(name) for name in ("dsh-schedule-scheduler.service",
                                           "dsh-schedule-worker@.service",
                                           "dsh-schedule-host@.service")}
    for name, unit in units.items():
        assert unit["User"] == ["agent-host"], name
        assert unit["EnvironmentFile"][0] == "/etc/dsh-schedule/env", name
        assert unit["EnvironmentFile"][1].startswith("-/etc/dsh-schedule/"), name
        assert unit["ExecStart"][0].startswith("/opt/dsh-schedule/venv/bin/dsh-schedule "), name
        assert unit["Restart"] == ["always"] and unit["KillSignal"] == ["SIGTERM"], name
        assert "WatchdogSec" not in unit, "the processes do not notify systemd"
    host = units["dsh-schedule-host@.service"]
    assert host["ExecStart"] == ["/opt/dsh-schedule/venv/bin/dsh-schedule host %i"]
    (check,) = host["ExecStartPre"]
    assert 'test -e "$${DSH_SCHEDULE_SESSIONS:-sessions}/%i.jsonl"' in check


# -- Prometheus -------------------------------------------------------------------------


def test_prometheus_scrapes_every_process_and_alerts_read_known_metrics() -> None:
    config = read_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    port = int(_compose()["x-dsh-schedule"]["environment"]["DSH_SCHEDULE_METRICS_PORT"])
    scraped = {}
    for job in config["scrape_configs"]:
        for sd in job["dns_sd_configs"]:
            assert sd["type"] == "A" and sd["port"] == port, job["job_name"]
            for name in sd["names"]:
                scraped[name] = job["job_name"]
    assert set(scraped) == {"scheduler", "worker", "host"}
    assert len(set(scraped.values())) == 3
    assert config["rule_files"] == ["alerts.yml"]

    rules_file = read_yaml(DEPLOY / "prometheus" / "alerts.yml")
    rules = [rule for group in rules_file["groups"] for rule in group["rules"]]
    names = [rule["alert"] for rule in rules]
    assert len(names) == len(set(names))
    used: set[str] = set()
    for rule in rules:
        expr = rule["expr"]
        metrics = set(re.findall(r"\bdsh_schedule_[a-z_]+", expr))
        assert metrics, f"{rule['alert']} reads no dsh_schedule metric"
        for metric in metrics:
            base = metric.removesuffix("_bucket") if metric.endswith("_bucket") else metric
            assert base in KNOWN_METRICS, f"{rule['alert']}: unknown metric {metric}"
            assert metric == base or base in HISTOGRAMS, metric
            used.add(base)
        assert rule["labels"]["severity"] in ("page", "warning"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert re.fullmatch(r"[0-9]+[smh]", rule.get("for", "0s")), rule["alert"]
        assert expr.count("(") == expr.count(")"), rule["alert"]
    assert used == KNOWN_METRICS

    def spaced(text: str) -> str:
        return " ".join(re.sub(r"([(),])", r" \1 ", text).split())

    by_expr = {spaced(rule["expr"]): rule for rule in rules}
    expected = {
        'time ( ) - max ( dsh_schedule_last_pass_timestamp_seconds{loop="mover"} ) > 60': None,
        "histogram_quantile ( 0.99 , sum ( rate ( dsh_schedule_lateness_seconds_bucket[5m] "
        ") ) by ( le , stage ) ) > 5": "5m",
        "increase ( dsh_schedule_redis_errors_total[5m] ) > 0": None,
        "deriv ( dsh_schedule_followups_pending[10m] ) > 0": "10m",
    }
    for expr, duration in expected.items():
        assert expr in by_expr, expr
        assert by_expr[expr].get("for") == duration, expr


def test_prometheus_files_pass_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        _tool_missing("promtool is not installed")
        return
    for command in (["check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
                    ["check", "rules", str(DEPLOY / "prometheus" / "alerts.yml")]):
        result = subprocess.run([promtool, *command], capture_output=True, text=True,
                                timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr


# -- the README -------------------------------------------------------------------------


def test_readme_and_env_example_name_every_variable_the_code_reads() -> None:
    readme = (DEPLOY / "README.md").read_text(encoding="utf-8")
    example = (DEPLOY / "env.example").read_text(encoding="utf-8")
    source = "".join(
        path.read_text(encoding="utf-8")
        for folder in ("dsh_schedule", "shared", "worker", "scheduler")
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "loadtest" not in path.parts
    )
    read = set(re.findall(r"\bDSH_SCHEDULE_[A-Z0-9_]*[A-Z0-9]\b", source))
    read |= set(environment_names().values())  # derived from the Settings fields
    read |= {"DSH_SCHEDULE_METRICS_PORT", "DSH_SCHEDULE_LOG_FORMAT", "DSH_SCHEDULE_LOG_LEVEL",
             "DSH_SCHEDULE_HOST_SESSIONS"}
    for var in sorted(read):
        assert f"`{var}`" in readme, f"deploy/README.md does not describe {var}"
        if var not in ("DSH_SCHEDULE_CRASH_AT", "DSH_SCHEDULE_TEST_CLOCK_SKEW"):
            assert var in example, f"deploy/env.example does not list {var}"
