"""The documents stay short enough for a newcomer to finish (issue 36): every Markdown file
under docs/ with the README and CONTRIBUTING, less the generated tool catalog and the
changelog, holds at most 25 000 words; docs/architecture.md at most 6 000 and the README
at most 1 500. Words are counted as ``wc -w docs/*.md`` counts them here: runs of bytes
between ASCII whitespace. History (what changed when, old measurements) belongs in
docs/changelog.md, which has no budget."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
NOT_COUNTED = frozenset({DOCS / "tool-catalog.md", DOCS / "changelog.md"})
TOTAL_BUDGET = 25_000
FILE_BUDGETS = {ROOT / "README.md": 1_500, DOCS / "architecture.md": 6_000}


def words(path: Path) -> int:
    """The runs of bytes between ASCII whitespace, as ``wc -w`` counts them."""
    return len(path.read_bytes().split())


def counted_docs() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted(DOCS.rglob("*.md"))]
    return [path for path in found if path not in NOT_COUNTED]


def test_words_are_counted_as_wc_counts_them(tmp_path: Path) -> None:
    # given text with runs of spaces, tabs, line breaks and a non-ASCII letter
    sample = tmp_path / "sample.md"
    sample.write_text("# Title\n\n  one\ttwo\r\nthree  é-four\n\n", encoding="utf-8")

    # when it is counted, then each run between whitespace is one word ("#" included)
    assert words(sample) == 6


def test_the_counted_documents_are_the_ones_a_reader_is_sent_to() -> None:
    # when the counted documents are listed
    counted = counted_docs()

    # then they hold the README, CONTRIBUTING and the nested integration guide, and
    # neither the generated catalog nor the changelog
    assert ROOT / "README.md" in counted
    assert ROOT / "CONTRIBUTING.md" in counted
    assert DOCS / "integrations" / "README.md" in counted
    assert not NOT_COUNTED & set(counted)
    assert all(path.exists() for path in NOT_COUNTED)


def test_the_documents_stay_within_their_word_budget() -> None:
    # when every counted document's words are counted
    counts = {path.relative_to(ROOT).as_posix(): words(path) for path in counted_docs()}
    total = sum(counts.values())

    # then together they stay within the budget
    table = "\n".join(f"{count:7d} {name}" for name, count in sorted(counts.items()))
    assert total <= TOTAL_BUDGET, (
        f"the docs hold {total} words, over the budget of {TOTAL_BUDGET}; shorten them "
        f"(history goes to docs/changelog.md, which is not counted):\n{table}"
    )


@pytest.mark.parametrize("path", sorted(FILE_BUDGETS), ids=lambda p: p.name)
def test_the_newcomers_documents_stay_within_their_own_budget(path: Path) -> None:
    # when the README and the architecture are counted, then each stays within its budget
    assert words(path) <= FILE_BUDGETS[path], (
        f"{path.relative_to(ROOT)} holds {words(path)} words, over {FILE_BUDGETS[path]}"
    )
