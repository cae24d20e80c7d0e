"""README.md and every page of docs/ write every command as it runs after the documented
install: ``make demo`` puts nothing on PATH, so a bare ``mdeci`` or the system's
``python -m sip`` in a code block fails for whoever copies it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BARE = re.compile(r"(^|[\s;&|(])(mdeci|python3? -m (sip|mdeci))\s")


def code_lines(text: str) -> list[tuple[int, str]]:
    """The lines of the code blocks (not ``text`` pictures), comments cut off."""
    lines: list[tuple[int, str]] = []
    inside = picture = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            inside = not inside
            picture = inside and line.strip() == "```text"
        elif inside and not picture and not line.lstrip().startswith(("#", "//", "[", "{")):
            lines.append((number, line.split(" #")[0]))
    return lines


DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("doc", DOCS)
def test_commands_in_code_blocks_name_the_installed_program(doc: str) -> None:
    bare = [
        f"{doc}:{n}: {line.strip()}"
        for n, line in code_lines((ROOT / doc).read_text())
        if BARE.search(line.replace("-g mdeci", "").replace("nologin mdeci", ""))
    ]
    assert bare == []


def test_the_readme_shows_report() -> None:
    assert "mdeci analytics report" in (ROOT / "README.md").read_text()
