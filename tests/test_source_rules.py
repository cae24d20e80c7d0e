"""Source rules every file keeps: none over 700 lines, and comments without tracker talk;
and docs/benchmarks.md stays within 400 lines.

Comments and docstrings say why the code is as it is, in the present tense. A reference
to a tracker entry or to one of its acceptance criteria says where a change came from,
which is the history git keeps, and it stops meaning anything once the entry is closed.
A file over 700 lines holds more than one responsibility; it is split by responsibility.

Both rules apply to the five packages and to the tests: tests are source read as the
specification of the code (mypy and ruff check them as strictly), and a test module
over 700 lines mixes subjects as a long module does.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sip", "rudp", "quicdata", "mdeci", "analytics", "tests")
MAX_LINES = 700
MAX_BENCHMARK_PAGE_LINES = 400

# "issue" or "criterion" (singular or plural, any case) followed by a number, with spaces,
# "#" or "-" between.
TRACKER_REFERENCE = re.compile(r"\bissues?[\s#-]*\d+|\bcriteri(?:on|a)[\s#-]*\d+", re.IGNORECASE)


def source_files() -> list[Path]:
    return [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]


def line_count(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def comments_and_docstrings(source: str) -> list[tuple[int, str]]:
    """Every comment and every module, class and function docstring, with its line."""
    found = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                found.append((first.lineno, first.value.value))
    return sorted(found)


def tracker_references(source: str) -> list[tuple[int, str]]:
    return [
        (line, match.group(0))
        for line, text in comments_and_docstrings(source)
        for match in TRACKER_REFERENCE.finditer(text)
    ]


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@functools.cache
def long_files() -> dict[str, int]:
    counts = {relative(p): line_count(p) for p in source_files()}
    return {name: n for name, n in counts.items() if n > MAX_LINES}


@functools.cache
def files_citing_the_tracker() -> dict[str, list[tuple[int, str]]]:
    found = {relative(p): tracker_references(p.read_text(encoding="utf-8")) for p in source_files()}
    return {name: refs for name, refs in found.items() if refs}


def test_no_source_file_is_over_700_lines() -> None:
    assert long_files() == {}, f"over {MAX_LINES} lines (split by responsibility)"


def test_the_benchmarks_page_stays_one_a_reader_can_hold() -> None:
    """docs/benchmarks.md gives the latest figures, each with its command: older runs
    belong to git's history, not to the page."""
    assert line_count(ROOT / "docs" / "benchmarks.md") <= MAX_BENCHMARK_PAGE_LINES


def test_no_comment_or_docstring_cites_the_tracker() -> None:
    found = files_citing_the_tracker()
    assert found == {}, "comments citing tracker entries (say why instead)"


# The samples' number is spliced in, so that this file cites no tracker entry itself.
N = "14"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (f"x = 1  # see issue {N}\n", [(1, f"issue {N}")]),
        (f"# Issue #{N}: the window\n", [(1, f"Issue #{N}")]),
        (f'"""Module for criterion {N}."""\n', [(1, f"criterion {N}")]),
        (f'def f() -> None:\n    """Criteria {N}-4 hold."""\n', [(2, f"Criteria {N}")]),
        ('class C:\n    """As criterion-3 asks."""\n', [(2, "criterion-3")]),
        ("# issues 10 and 12\n", [(1, "issues 10")]),
        (f'x = "issue {N}"  # a string value, not a comment\n', []),
        ("# the UA issues a request; an issue with no number\n", []),
        (f"# tissue {N} is not a word boundary\n", []),
    ],
)
def test_tracker_references_are_found_in_comments_and_docstrings_only(
    source: str, expected: list[tuple[int, str]]
) -> None:
    assert tracker_references(source) == expected


def test_line_count_counts_lines_as_wc_does(tmp_path: Path) -> None:
    path = tmp_path / "m.py"
    path.write_text("a = 1\n" * (MAX_LINES + 1), encoding="utf-8")
    assert line_count(path) == MAX_LINES + 1
