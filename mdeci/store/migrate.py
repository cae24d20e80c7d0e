"""Schema migrations: ``alembic upgrade head`` on a database URL (``mdeci db upgrade``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mdeci.errors import StoreError

if TYPE_CHECKING:
    from alembic.config import Config

# The migrations ship inside the package (package data in pyproject.toml), so an installed
# wheel can upgrade a database from any folder; no alembic.ini is needed.
MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(url: str) -> Config:
    """An Alembic :class:`~alembic.config.Config` for the packaged migrations on ``url``."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str) -> str:
    """Run every pending migration on ``url``; returns the revision now in place.

    Raises :class:`StoreError` with a one-line message (password hidden) when the URL is
    not a database URL, the database cannot be reached, or a migration fails.
    """
    from alembic import command
    from alembic.script import ScriptDirectory

    shown = _redact(url)
    _check_url(url, shown)
    cfg = alembic_config(url)
    try:
        command.upgrade(cfg, "head")
    except Exception as exc:  # one line for the operator, not a traceback
        raise StoreError(f"cannot upgrade {shown}: {_first_line(exc)}") from exc
    heads = ScriptDirectory.from_config(cfg).get_heads()
    return heads[0] if heads else ""


def _check_url(url: str, shown: str) -> None:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        parsed = make_url(url)
        parsed.get_dialect()
    except (ArgumentError, NoSuchModuleError, ValueError) as exc:
        raise StoreError(f"not a usable database URL {shown}: {_first_line(exc)}") from None
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        folder = Path(parsed.database).parent
        if not folder.is_dir():
            # SQLite would say only "unable to open database file".
            raise StoreError(f"cannot upgrade {shown}: folder {folder} does not exist")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _redact(url: str) -> str:
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL may itself contain a password
        return "<database url>"
