"""Finding the churn-log files under a path and reading them as parsed lines."""

from __future__ import annotations

import bz2
import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from analytics import parse
from analytics.errors import InputError

FORMATS = ("auto", "jsonl", "parquet")


@dataclass(frozen=True, slots=True)
class Inputs:
    """What will be read: the format and the paths (files, or one URL for remote storage)."""

    fmt: str
    paths: list[str]
    skipped: list[str] = field(default_factory=list)  # files that are not churn logs
    size: int | None = None  # bytes of the local inputs (None for a URL)

    rows: int | None = None  # rows of the local Parquet inputs (from their footers)

    @property
    def small(self) -> bool:
        """A log small enough that start-up, not data, is the cost (see spark.session):
        at most ~100,000 lines. Parquet is compressed ~10x, so its row count decides."""
        if self.fmt == "parquet":
            return self.rows is not None and self.rows <= SMALL_INPUT_ROWS
        return self.size is not None and self.size <= SMALL_INPUT_BYTES

    @property
    def moderate(self) -> bool:
        """A log of at most a few million lines: the run lasts tens of seconds."""
        if self.fmt == "parquet":
            return self.rows is not None and self.rows <= QUICK_JIT_ROWS
        return self.size is not None and self.size <= QUICK_JIT_BYTES


SMALL_INPUT_BYTES = 16 << 20
SMALL_INPUT_ROWS = 100_000
# Up to here the quick JIT alone is cheaper than the optimising one (see spark.session).
QUICK_JIT_BYTES = 1 << 30
QUICK_JIT_ROWS = 4_000_000
# How much of a file is read to tell a churn log from anything else.
SNIFF_BYTES = 64 * 1024
SNIFF_LINES = 50


def _head(path: Path) -> bytes:
    """The first bytes of ``path``, decompressed when it is gzip or bzip2 (as Spark reads it)."""
    with path.open("rb") as raw:
        magic = raw.read(3)
    opener = gzip.open if magic[:2] == b"\x1f\x8b" else bz2.open if magic == b"BZh" else open
    try:
        with opener(path, "rb") as f:
            return bytes(f.read(SNIFF_BYTES))
    except (OSError, EOFError):  # a corrupt archive is not a log either
        return b""


def looks_like_log(path: Path) -> bool:
    """Whether ``path`` holds churn-log lines: one of its first lines is a JSON object with
    ``ts`` and ``event``. Parquet must have the magic bytes (and ``ts``/``event`` columns).

    Only a sample is read, so that a folder of other files (a README, images, a
    pretty-printed JSON config) is refused before the JVM starts, with one error line
    instead of a Spark job that quarantines every line. A log whose first lines are all
    damaged is the price; its later lines would be counted anyway if any file is a log.
    """
    try:
        if path.suffix == ".parquet":
            with path.open("rb") as f:
                if f.read(4) != b"PAR1":
                    return False
            try:
                import pyarrow.parquet as pq
            except ImportError:  # pragma: no cover - pyarrow comes with the analytics extra
                return True
            try:
                names = set(pq.read_schema(path).names)
            except Exception:  # pyarrow raises several types for a bad footer
                return False
            return {"ts", "event"} <= names
        head = _head(path)
    except OSError:
        return False
    for n, raw in enumerate(head.splitlines()):
        if n >= SNIFF_LINES:
            break
        try:
            record = json.loads(raw)
        except ValueError:  # includes UnicodeDecodeError: binary files
            continue
        if isinstance(record, dict) and "ts" in record and "event" in record:
            return True
    return False


def is_remote(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def find_inputs(path: str, fmt: str = "auto") -> Inputs:
    """The churn-log files under ``path``.

    A local directory is walked recursively: ``*.parquet`` files are Parquet copies, any
    other regular file (``churn.log``, ``churn.log.1``, ``x.jsonl``, ``x.jsonl.gz``) is
    JSON lines; names starting with ``.`` or ``_`` are skipped. With ``auto`` and both
    kinds present, JSON lines win: they are the log itself, the Parquet files a copy.
    Files that do not look like churn logs (:func:`looks_like_log`) are skipped and
    listed in ``skipped``. A URL of remote storage (``hdfs://``, ``s3a://``) is handed
    to Spark as it is.

    Raises:
        InputError: if the path does not exist or holds no log files.
    """
    if fmt not in FORMATS:
        raise InputError(f"unknown input format {fmt!r}; use one of {', '.join(FORMATS)}")
    if is_remote(path):
        guessed = "parquet" if path.rstrip("/").endswith(".parquet") else "jsonl"
        return Inputs(guessed if fmt == "auto" else fmt, [path])
    local = Path(path.removeprefix("file://"))
    if not local.exists():
        raise InputError(f"input {path} does not exist")
    if local.is_file():
        files = [local]
    else:
        files = sorted(
            Path(root) / name
            for root, dirs, names in os.walk(local)
            for name in names
            if not name.startswith((".", "_"))
            and not any(part.startswith((".", "_")) for part in Path(root).relative_to(local).parts)
        )
    files = [f for f in files if f.suffix != ".crc"]
    if not files:
        raise InputError(f"no churn-log files (JSON lines or Parquet) under {path}: it is empty")
    logs = [f for f in files if looks_like_log(f)]
    skipped = [str(f) for f in files if f not in logs]
    parquet = [f for f in logs if f.suffix == ".parquet"]
    text = [f for f in logs if f.suffix != ".parquet"]
    if not logs:
        examples = ", ".join(Path(f).name for f in skipped[:3])
        more = f" and {len(skipped) - 3} more" if len(skipped) > 3 else ""
        raise InputError(
            f"no churn-log files (JSON lines or Parquet) under {path}: {len(skipped)} "
            f"file(s) that are not churn logs ({examples}{more})"
        )
    if fmt == "auto":
        fmt = "jsonl" if text else "parquet"
    chosen = text if fmt == "jsonl" else parquet
    if not chosen:
        raise InputError(f"no {fmt} churn-log files under {path}")
    size = sum(f.stat().st_size for f in chosen)
    rows = None
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            rows = sum(pq.ParquetFile(f).metadata.num_rows for f in chosen)
        except Exception:  # a footer pyarrow cannot read: Spark will say what is wrong
            rows = None
    return Inputs(fmt, [str(f.resolve()) for f in chosen], skipped, size, rows)


def read_parsed(
    spark: SparkSession, inputs: Inputs, *, keep_extra: bool = False, source: bool = True
) -> DataFrame:
    """The parsed lines of ``inputs`` (see :func:`analytics.parse.parse_lines`).

    Without ``source`` (Parquet only) the ``source`` column is null: a read whose invalid
    lines are not written needs no file name, and Spark then builds no file-metadata
    struct for every row (its path, size, block and row index).
    """
    if inputs.fmt == "parquet":
        df = spark.read.option("recursiveFileLookup", "true").parquet(*inputs.paths)
        if not source:
            return parse.parse_records(df)
        return parse.parse_records(df.select("*", F.col("_metadata.file_path").alias("source")))
    source_col = F.col("_metadata.file_path").alias("source")
    reader = spark.read.option("recursiveFileLookup", "true")
    return parse.parse_lines(
        reader.text(inputs.paths).select("value", source_col), keep_extra=keep_extra
    )
