"""The command registry: every entry loads explicitly; a broken one fails loudly; a missing
dependency is one line; --version; ``mdeci check``."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from collections.abc import Iterator
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
    """A lookup by any ``run_<name>`` attribute would find the ``run_broker`` the broker
    module imports from the app, and call it with the wrong arguments."""
    module = importlib.import_module("mdeci.commands.broker")
    assert load("broker").run is module.run


def test_a_missing_module_fails_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(REGISTRY, "ghost", Entry("mdeci.commands.no_such_module", "x"))
    with pytest.raises(ModuleNotFoundError):
        main(["ghost"])


# A fresh interpreter in which cbor2 cannot be imported, as in a Python outside mdeci's
# environment (the system's `python3 -m mdeci`).
WITHOUT_CBOR2 = (
    "import sys; sys.modules['cbor2'] = None; from mdeci.cli import main; "
    "sys.exit(main(sys.argv[1:]))"
)


@pytest.mark.parametrize(
    "argv", [["admin", "sessions", "--config", "configs/broker.toml"], ["broker", "--help"]]
)
def test_a_dependency_missing_from_the_interpreter_is_one_line_and_exit_2(
    argv: list[str],
) -> None:
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_CBOR2, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (out.returncode, out.stdout) == (2, ""), out.stderr
    assert out.stderr == (
        f"mdeci {argv[0]}: error: module 'cbor2' is not installed for {sys.executable}; run "
        "mdeci from the environment it is installed in (.venv/bin/mdeci after make demo)\n"
    )


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
    """Client commands import only what they use (the daemon's imports cost 0.7-0.9 s)."""
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


def _parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                yield from _parsers(child)


@pytest.mark.parametrize("name", ["", *sorted(REGISTRY)])
def test_help_text_has_no_markup(name: str) -> None:
    parser, _ = cli.build_parser([name] if name else [])
    for each in _parsers(parser):
        text = each.format_help()
        for markup in ("`", ":class:", ":func:", ":mod:", ":data:", "**"):
            assert markup not in text, f"{each.prog}: {markup} in\n{text}"


@pytest.mark.parametrize(
    ("name", "codes"),
    [("pub", ("0 published", "3 sent or buffered", "4 refused", "2 error")), ("sub", ("3 the",))],
)
def test_client_help_states_the_exit_status(name: str, codes: tuple[str, ...]) -> None:
    parser, _ = cli.build_parser([name])
    (child,) = [p for p in _parsers(parser) if p.prog == f"mdeci {name}"]
    text = " ".join(child.format_help().split())
    assert all(code in text for code in codes), text


def test_plain_removes_roles_and_quotes() -> None:
    assert cli.plain("The ``mdeci`` line, :class:`~a.b.Thing` **x**") == "The mdeci line, Thing x"


def test_bash_completion_completes_commands_actions_and_options(tmp_path: Path) -> None:
    import subprocess

    from mdeci.commands.completion import bash_script

    script = tmp_path / "mdeci.bash"
    script.write_text(bash_script())
    probe = (
        f"source {script}\n"
        'complete_words() { COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); _mdeci;'
        ' echo "${COMPREPLY[*]}"; }\n'
        "complete_words mdeci ad\n"
        "complete_words mdeci admin q\n"
        "complete_words mdeci admin queue --p\n"
        "complete_words mdeci pub --u\n"
    )
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["admin", "queue", "--payload", "--urgent"]
    assert main(["completion", "bash"]) == 0


def test_analytics_without_the_extra_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "churn.log"
    log.write_text("")
    for name in ("pyspark", "pyarrow", "pandas"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails: not installed
    code = main(["analytics", "churn", "--input", str(log), "--output", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2
    assert err == (
        "mdeci analytics churn: error: pyspark is not installed; "
        "install the extra: pip install 'mdeci[analytics]'\n"
    )


def test_init_writes_the_samples_and_keeps_existing_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dest = tmp_path / "etc"
    assert main(["init", "--dest", str(dest)]) == 0
    for name in ("broker.toml", "agent.toml", "kamailio.cfg", "systemd/mdeci-broker.service"):
        assert (dest / name).read_bytes() == (ROOT / "configs" / name).read_bytes()
    assert (dest / "broker.toml").stat().st_mode & 0o077 == 0
    capsys.readouterr()
    assert main(["init", "--dest", str(dest)]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["init", "--dest", str(dest), "--force"]) == 0
