"""Fixtures of the analytics tests: one local SparkSession for the whole run.

The machine's two cores are shared, so Spark gets ``local[2]`` and 4 shuffle partitions,
and the UI (a port per session) is off.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.peers import require_binary


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
