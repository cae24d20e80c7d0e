"""``mdeci db upgrade`` through ``mdeci.cli.main``: success, and one-line errors."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from mdeci.cli import main
from mdeci.errors import StoreError
from mdeci.store.migrate import upgrade


def _head(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        (version,) = conn.execute("SELECT version_num FROM alembic_version").fetchone()
    return str(version)


def test_upgrade_by_url(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "b.db"
    assert main(["db", "upgrade", "--url", f"sqlite:///{db}"]) == 0
    out = capsys.readouterr().out
    assert out == f"database at revision {_head(db)}\n"
    # a second run is a no-op at the same revision
    assert main(["db", "upgrade", "--url", f"sqlite:///{db}"]) == 0
    assert capsys.readouterr().out == out


def test_upgrade_by_config_creates_data_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "broker.toml"
    config.write_text('data_dir = "data"\n', "utf-8")
    assert main(["db", "upgrade", "--config", str(config)]) == 0
    assert (tmp_path / "data" / "broker.db").is_file()
    assert "database at revision" in capsys.readouterr().out


def test_upgrade_function_returns_head(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    assert upgrade(f"sqlite:///{db}") == _head(db)


def _error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1, captured.err  # one line, no traceback
    assert "Traceback" not in captured.err
    return captured.err


def test_bad_url_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["db", "upgrade", "--url", "not a url"], capsys)
    assert err.startswith("mdeci db: error: not a usable database URL")


def test_unknown_dialect_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["db", "upgrade", "--url", "nosuchdb://x/y"], capsys)
    assert "not a usable database URL nosuchdb://x/y" in err


def test_missing_folder_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["db", "upgrade", "--url", f"sqlite:///{tmp_path}/no/such/x.db"], capsys)
    assert "folder" in err and "does not exist" in err


def test_unreachable_server_hides_password(capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgresql+psycopg://user:hunter2@127.0.0.1:1/db?connect_timeout=2"
    err = _error(["db", "upgrade", "--url", url], capsys)
    assert "hunter2" not in err
    assert err.startswith("mdeci db: error: cannot upgrade postgresql+psycopg://user:***@")


def test_missing_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _error(["db", "upgrade", "--config", str(tmp_path / "none.toml")], capsys)
    assert err == f"mdeci db: error: {tmp_path / 'none.toml'}: no such file\n"


def test_bad_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "broker.toml"
    config.write_text("[store]\nurll = 'x'\n", "utf-8")
    err = _error(["db", "upgrade", "--config", str(config)], capsys)
    assert err == f"mdeci db: error: {config}: unknown key 'store.urll'\n"


def test_a_source_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["db", "upgrade"])
    assert info.value.code == 2
    assert "--config" in capsys.readouterr().err


def test_store_error_is_an_mdeci_error() -> None:
    with pytest.raises(StoreError):
        upgrade("::")
