"""Fixtures of the analytics tests: one local SparkSession for the whole run.

The machine's two cores are shared, so Spark gets ``local[2]`` and 4 shuffle partitions,
and the UI (a port per session) is off.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.peers import require_binary


# pyspark 4 warns that it does not fully support pandas 3 whenever it loads pandas; the
# jobs do not go through pandas, so the warning says nothing about them.
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/analytics" in str(item.path):
            item.add_marker(
                pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas")
            )


@pytest.fixture(scope="session", autouse=True)
def _no_class_archive() -> Iterator[None]:
    """The CLI runs of the tests leave the JVM's class archive alone: the first run that
    writes one waits for it (a minute or more on 2 cores) and would blow their timeouts.
    The benchmark turns it on; ``test_spark.py`` tests the archive's key."""
    saved = os.environ.get("MDECI_SPARK_CLASS_CACHE")
    os.environ["MDECI_SPARK_CLASS_CACHE"] = "off"
    yield
    if saved is None:
        del os.environ["MDECI_SPARK_CLASS_CACHE"]
    else:
        os.environ["MDECI_SPARK_CLASS_CACHE"] = saved


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    require_binary("java", "apt-get install openjdk-17-jre-headless")
    pytest.importorskip("pyspark")
    from analytics.spark import session

    s = session(
        "local[2]",
        shuffle_partitions=4,
        conf={
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.driver.memory": "1g",
        },
    )
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


# The cross-checked log: ~200,000 events of commuters over a week, with more duplicates,
# swapped and truncated lines than a real log, and a small queue so that drops happen.
CROSS_USERS = 120
CROSS_DAYS = 7


@pytest.fixture(scope="session")
def generated_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from analytics.generate import GeneratorConfig, generate
    from analytics.mobility import MobilityParams

    out = tmp_path_factory.mktemp("log")
    cfg = GeneratorConfig(
        users=CROSS_USERS,
        days=CROSS_DAYS,
        seed=20240506,
        model="commute",
        queue_limit=6,
        mobility=MobilityParams(night_off_share=0.4),
        duplicate_fraction=0.005,
        reorder_fraction=0.005,
        malformed_fraction=0.001,
        users_per_shard=40,
    )
    generate(cfg, out, parquet=False)
    return out / "jsonl"


# The window cuts the week at odd instants, so that episodes cross both edges.
CROSS_SINCE = "2024-03-05T07:13:20.500Z"
CROSS_UNTIL = "2024-03-10T03:00:00Z"


@pytest.fixture(scope="session")
def churn_output(spark: Any, generated_log: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from analytics.churn import run_churn
    from analytics.cli import parse_time
    from analytics.jobs import JobConfig, TimeWindow

    out = tmp_path_factory.mktemp("churn")
    window = TimeWindow(
        since_ms=parse_time(CROSS_SINCE, "--since"), until_ms=parse_time(CROSS_UNTIL, "--until")
    )
    run_churn(spark, str(generated_log), str(out), JobConfig(window=window))
    return out
