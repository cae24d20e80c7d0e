"""The layering rules (sans-IO cores; lower layers never import upper ones), on the source."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IO_MODULES = {"asyncio", "socket", "time", "os", "selectors", "threading"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def _sources(package: str, exclude: tuple[str, ...] = ()) -> list[Path]:
    base = ROOT / package
    return [
        p
        for p in sorted(base.rglob("*.py"))
        if not any(part in exclude for part in p.relative_to(base).parts)
        and not p.name.startswith("__main__")
    ]


# The adapters (aio/), the command-line tools and the impairment proxy own the I/O.
ADAPTERS = ("aio", "tools", "impair.py", "cli.py")


@pytest.mark.parametrize("package", ["sip", "rudp"])
def test_protocol_cores_are_sans_io(package: str) -> None:
    offenders = {
        str(p.relative_to(ROOT)): sorted(_imports(p) & IO_MODULES)
        for p in _sources(package, ADAPTERS)
        if _imports(p) & IO_MODULES
    }
    assert offenders == {}, f"sans-IO cores import I/O modules: {offenders}"


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("sip", {"mdeci", "rudp", "analytics"}),
        ("rudp", {"mdeci", "sip", "analytics"}),
        ("analytics", {"mdeci", "sip", "rudp"}),
    ],
)
def test_lower_layers_do_not_import_upper(package: str, forbidden: set[str]) -> None:
    offenders = {
        str(p.relative_to(ROOT)): sorted(_imports(p) & forbidden)
        for p in _sources(package)
        if _imports(p) & forbidden
    }
    assert offenders == {}


def test_sql_only_in_store() -> None:
    offenders = [
        str(p.relative_to(ROOT))
        for p in _sources("mdeci", ("store",))
        if "sqlalchemy" in _imports(p)
    ]
    assert offenders == []


# The repository stands on its own: docs/ is the reference, never the design notes that
# lived beside it before the project existed.
OUTSIDE_REFERENCES = re.compile(r"\.\./shared|(?<![\w/])(PROTOCOL|ARCHITECTURE|STYLE|PJSUA2)\.md")


def test_nothing_cites_files_outside_the_repository() -> None:
    texts = [
        p
        for folder in ("sip", "rudp", "mdeci", "analytics", "tests", "docs", "configs")
        for p in sorted((ROOT / folder).rglob("*"))
        if p.suffix in {".py", ".md", ".toml", ".cfg", ".conf"}
    ] + [ROOT / "README.md"]
    offenders = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in texts
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if OUTSIDE_REFERENCES.search(line) and p != Path(__file__)
    ]
    assert offenders == [], f"cite docs/ instead: {offenders}"
