"""The command registry: every entry loads explicitly; a broken one fails loudly; --version;
``mdeci check``."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from mdeci import cli
from mdeci.cli import REGISTRY, Entry, RegistryError, load, main
from mdeci.commands import Command

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_registered_command_is_exported_by_its_module(name: str) -> None:
    command = load(name)
    assert isinstance(command, Command)
    assert command.name == name


def test_a_module_importing_another_runner_does_not_change_the_command() -> None:
    """The old lookup took any ``run_<name>`` attribute: the broker module imported
    ``run_broker`` from the app and the CLI called it with the wrong arguments."""
    module = importlib.import_module("mdeci.commands.broker")
    assert load("broker").run is module.run


def test_a_missing_module_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REGISTRY, "ghost", Entry("mdeci.commands.no_such_module", "x"))
    with pytest.raises(ModuleNotFoundError):
        main(["ghost"])


def test_a_module_without_the_command_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REGISTRY, "ghost", Entry("mdeci.commands.db", "x"))
    with pytest.raises(RegistryError, match="does not export the command 'ghost'"):
        main(["ghost"])


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"mdeci {cli.version()}"
    assert cli.version()[0].isdigit()


def test_a_client_command_does_not_import_the_broker_or_sqlalchemy() -> None:
    """Client commands import only what they use (issue 15: 0.7-0.9 s before)."""
    import subprocess

    code = (
        "import sys; from mdeci.cli import build_parser; build_parser(['status']);"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('sqlalchemy', 'alembic', 'psycopg', 'pyroute2', 'aiohttp', 'smpplib', 'asyncio', 'rich')"
        " or m.startswith('mdeci.broker') or m.startswith('mdeci.store'));"
        "print(heavy)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


def test_check_accepts_the_shipped_configs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--config", str(ROOT / "configs/broker.toml")]) == 0
    assert capsys.readouterr().out.strip().endswith("ok (broker)")
    assert main(["check", "--config", str(ROOT / "configs/agent.toml")]) == 0
    assert capsys.readouterr().out.strip().endswith("ok (agent)")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[queue]\nmaxx = 1\n", "unknown key 'queue.maxx'"),
        ("[registrar]\nembedded = false\naddress = '127.0.0.1:5070'\n", "needs an [[auth.users]]"),
        ('aor = "sip:alice@localhost"\n', "missing key 'password'"),
        ("not toml [", "broker.toml: "),
    ],
)
def test_check_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expected: str
) -> None:
    path = tmp_path / "broker.toml"
    path.write_text(text)
    assert main(["check", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("mdeci check: error: ")
    assert expected in err
