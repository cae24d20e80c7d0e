"""Fixtures of the SMS integration tests: the broker tests' store and clock, and a sink
that can wait for any condition."""

from __future__ import annotations

import pytest

from tests.broker.conftest import clock, store  # noqa: F401
from tests.smsint.harness import Sink
from tests.store.conftest import sqlite_path, sqlite_template  # noqa: F401


@pytest.fixture
def sink() -> Sink:
    return Sink()
