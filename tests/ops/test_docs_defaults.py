"""The defaults docs/operations.md gives for the broker's and the agent's keys are the
code's: each row whose default is a TOML value is compared with the config object."""

from __future__ import annotations

import enum
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from mdeci.config import AgentConfig, BrokerConfig
from mdeci.config.common import HostPort

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `([a-z_]+(?:\.[a-z_]+)*)` \| `([^`]*)` \|", re.MULTILINE)


def _section(title: str) -> str:
    text = (ROOT / "docs" / "operations.md").read_text()
    start = text.index(f"\n## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end]


def _plain(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, HostPort):
        return f"{value.host}:{value.port}"
    return value


def _documented(section: str, config: object) -> list[tuple[str, object, object]]:
    """(key, documented default, the code's) of each row that names an attribute."""
    rows = []
    for key, text in ROW.findall(section):
        try:
            documented = tomllib.loads(f"x = {text}")["x"]
        except tomllib.TOMLDecodeError:
            continue  # prose, not a value
        value: Any = config
        try:
            for part in key.split("."):
                value = getattr(value, part)
        except AttributeError:
            continue  # a key the loader maps elsewhere
        rows.append((key, _plain(documented), _plain(value)))
    return rows


@pytest.mark.parametrize(
    ("title", "config"),
    [
        ("3. Broker keys", BrokerConfig()),
        ("4. Agent keys", AgentConfig(aor="sip:alice@localhost", password="x")),
    ],
    ids=["broker", "agent"],
)
def test_documented_defaults_are_the_codes(title: str, config: object) -> None:
    rows = _documented(_section(title), config)
    assert len(rows) >= 10, rows  # the table was read
    wrong = [(key, doc, code) for key, doc, code in rows if doc != code]
    assert not wrong, wrong
