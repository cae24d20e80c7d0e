"""Every repository file the docs name exists: a renamed test or module leaves no page
pointing at nothing (the docs are the reference, and a reader follows their paths)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([*(ROOT / "docs").glob("*.md"), ROOT / "README.md"])
# A path in backticks under one of the repository's own folders, with an optional
# ``::test`` or ``:line`` after it; globs and placeholders are not files.
CITED = re.compile(
    r"`((?:sip|rudp|quicdata|mdeci|analytics|tests|configs|systemd|docs|examples)/"
    r"[\w./-]+\.(?:py|md|toml|cfg|conf|list|service|json|sh))(?:::[\w\[\]-]+)?`"
)


def cited(page: Path) -> list[str]:
    return sorted(set(CITED.findall(page.read_text("utf-8"))))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_cited_file_exists(page: Path) -> None:
    missing = [path for path in cited(page) if not (ROOT / path).exists()]
    assert not missing, f"{page.name} names files that do not exist: {missing}"


def test_the_pattern_finds_a_cited_test() -> None:
    text = "see `tests/ops/test_docs_paths.py::test_every_cited_file_exists` and `a/b.py`"
    assert CITED.findall(text) == ["tests/ops/test_docs_paths.py"]
