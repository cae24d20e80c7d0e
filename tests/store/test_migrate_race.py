"""Several brokers started at once on one new PostgreSQL database each migrate it at start
(mdeci/broker/app.py): the upgrades must queue, not race to create the same tables."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from mdeci.store.base import make_engine
from tests.e2e.harness_b import drop_pg_schema, pg_schema_url
from tests.peers import pg_url

BROKERS = 4


@pytest.fixture
def fresh_schema_url() -> Iterator[str]:
    base = pg_url()
    schema, url = pg_schema_url(base)
    try:
        yield url
    finally:
        drop_pg_schema(base, schema)


def test_brokers_upgrading_one_new_database_at_once_all_succeed(fresh_schema_url: str) -> None:
    # Processes, as brokers are: Alembic's command API keeps module-level state and is not
    # for threads of one process.
    upgrades = [
        subprocess.Popen(
            [sys.executable, "-m", "mdeci", "db", "upgrade", "--url", fresh_schema_url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(BROKERS)
    ]
    outcomes = [(p.wait(60), *p.communicate()) for p in upgrades]
    assert [(rc, err) for rc, _, err in outcomes if rc != 0] == []
    engine = make_engine(fresh_schema_url)
    try:
        with engine.connect() as conn:
            versions = conn.execute(sa.text("SELECT version_num FROM alembic_version")).all()
    finally:
        engine.dispose()
    assert len(versions) == 1
    assert all(versions[0][0] in out for _, out, _ in outcomes)
