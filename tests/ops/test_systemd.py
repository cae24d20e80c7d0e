"""``systemd-analyze verify`` passes on the shipped unit files,
with no warning at all (an unknown key is only a warning, so stderr must be empty)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.peers import require_binary

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "configs" / "systemd"
INSTALLED = "/opt/mdeci/bin/mdeci"  # where docs/operations.md installs the wheel


def _verify(tmp_path: Path, name: str, unit: str, text: str) -> subprocess.CompletedProcess[str]:
    tool = require_binary("systemd-analyze", "apt-get install systemd")
    # verify also checks that ExecStart's program exists: point it at this checkout's.
    mdeci = ROOT / ".venv" / "bin" / "mdeci"
    (tmp_path / name).write_text(text.replace(INSTALLED, str(mdeci)))
    if unit != name:
        (tmp_path / unit).symlink_to(tmp_path / name)
    return subprocess.run(
        [tool, "verify", str(tmp_path / unit)], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("name", "unit"),
    [
        ("mdeci-broker.service", "mdeci-broker.service"),
        ("mdeci-agent@.service", "mdeci-agent@alice.service"),
    ],
)
def test_units_verify_cleanly(tmp_path: Path, name: str, unit: str) -> None:
    text = (UNITS / name).read_text()
    assert INSTALLED in text
    for option in ("ProtectSystem=strict", "NoNewPrivileges=yes", "ProtectHome=yes"):
        assert option in text
    result = _verify(tmp_path, name, unit, text)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr


def test_verify_catches_a_bad_unit(tmp_path: Path) -> None:
    """The check above can fail: a misspelt option is reported."""
    text = (UNITS / "mdeci-broker.service").read_text().replace("ProtectHome=", "ProtectHomme=")
    result = _verify(tmp_path, "mdeci-broker.service", "mdeci-broker.service", text)
    assert "ProtectHomme" in result.stderr
