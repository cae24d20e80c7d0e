"""Fixtures of the agent tests: a broker core on a migrated SQLite file, and the far end."""

from __future__ import annotations

# The broker tests' store and clock fixtures, and the store tests' migrated template.
from tests.broker.conftest import clock, sink, store  # noqa: F401
from tests.store.conftest import sqlite_path, sqlite_template  # noqa: F401
