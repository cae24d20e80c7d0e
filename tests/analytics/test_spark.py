"""The driver JVM's class archive: where it lives, when it is read, when it is written."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from analytics import spark as S

pytestmark = pytest.mark.peer("spark")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pytest.importorskip("pyspark")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("MDECI_SPARK_CLASS_CACHE", "on")
    return tmp_path


def test_the_archive_is_kept_in_the_user_cache_under_a_stable_key(cache: Path) -> None:
    archive = S.class_archive()
    assert archive is not None
    assert archive.parent == cache / "mdeci"
    assert archive.name.startswith("spark-classes-") and archive.suffix == ".jsa"
    assert S.class_archive() == archive


def test_another_java_gets_another_archive(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = S.class_archive()
    java = cache / "jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("")
    monkeypatch.setenv("JAVA_HOME", str(cache / "jdk"))
    assert S.class_archive() not in (None, first)


def test_switched_off_by_the_environment(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MDECI_SPARK_CLASS_CACHE", "off")
    assert S.class_archive() is None
    assert S._archive_options() == []


def test_first_run_writes_a_private_file_then_runs_read_the_archive(cache: Path) -> None:
    archive = S.class_archive()
    assert archive is not None
    try:
        first = S._archive_options()
        partial = archive.with_name(f"{archive.name}.{os.getpid()}.tmp")
        assert f"-XX:ArchiveClassesAtExit={partial}" in first
        assert [partial] == S._DUMPING
    finally:
        S._DUMPING.clear()
    archive.write_bytes(b"")
    later = S._archive_options()
    assert f"-XX:SharedArchiveFile={archive}" in later
    assert not any(o.startswith("-XX:ArchiveClassesAtExit") for o in later)
    assert S._DUMPING == []


def test_finishing_a_run_that_writes_no_archive_leaves_the_session_alone(spark: Any) -> None:
    assert S._DUMPING == []
    S.finish(spark)
    assert spark.range(3).count() == 3


def test_a_local_driver_runs_the_throughput_collector(spark: Any) -> None:
    """A batch job wants throughput, not short pauses: the parallel collector, not G1
    (10M events: 142 s of JVM CPU against 164-167 s)."""
    beans = spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    names = {bean.getName() for bean in beans}
    assert names == {"PS Scavenge", "PS MarkSweep"}, names
