"""Fixtures of the security tests: the broker tests' store, clock and sink."""

from __future__ import annotations

from tests.broker.conftest import clock, sink, store  # noqa: F401
from tests.store.conftest import sqlite_path, sqlite_template  # noqa: F401
