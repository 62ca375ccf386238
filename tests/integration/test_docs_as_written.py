"""What the docs tell a reader to run, or quote a command saying, is what happens."""

from __future__ import annotations

import re
from pathlib import Path

from tests.integration.test_cli import cli, closed_port, one_line_error

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md")),
        *sorted((ROOT / "deploy").rglob("*.md"))]
# The distribution named as a requirement, with or without extras.
BY_NAME = re.compile(r"dsh-tool-schedule(?:\[[^\]]*\])?")


def test_the_docs_install_the_project_from_a_checkout_or_its_repository() -> None:
    """The project is on no package index: every pip install that names it by its
    distribution name gives the repository's URL with it."""
    from_an_index = [
        f"{doc.relative_to(ROOT)}: {line.strip()}"
        for doc in DOCS
        for line in doc.read_text(encoding="utf-8").splitlines()
        if "pip install" in line
        and any(" @ git+" not in line[match.end():match.end() + 8]
                for match in BY_NAME.finditer(line))
    ]
    assert from_an_index == []


def test_deploy_readme_quotes_what_a_host_for_a_missing_session_says(tmp_path: Path) -> None:
    readme = (ROOT / "deploy" / "README.md").read_text(encoding="utf-8")
    quoted = re.search(r"`(dsh-schedule: host: [^`]*)`", readme)
    assert quoted is not None, "deploy/README.md quotes the host's refusal"
    said = " ".join(quoted.group(1).split())
    sessions = tmp_path / "sessions"
    assert cli("session", "create", "bob", "--sessions", str(sessions)).returncode == 0
    env = {"DSH_SCHEDULE_SESSIONS": str(sessions),
           "DSH_SCHEDULE_REDIS_URL": f"redis://127.0.0.1:{closed_port()}/0"}
    line = one_line_error(cli("host", "bob", "alice", env=env))  # exit 2, one line
    assert line == said.replace("/var/lib/agent-host/sessions", str(sessions))
