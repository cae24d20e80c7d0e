"""Writing the tables: Parquet and CSV (locally with pyarrow, remotely with Spark), the
summary, the provenance record and the quarantine as JSON lines."""

from __future__ import annotations

import csv as csvlib
import json
import math
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from analytics import schema as S
from analytics.inputs import Inputs


def csv_cell(value: object) -> str:
    # Integers stay integers: a count kept in a double column (``summary.value``) is
    # written ``215``, not ``215.0``, and an epoch in milliseconds not ``1.79E12``.
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if value.is_integer() and abs(value) < 2**53:
            return str(int(value))
        return repr(value)
    if isinstance(value, datetime):
        moment = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return moment.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    return str(value)


def write_local_csv(parquet_dir: Path, csv_dir: Path) -> None:
    """``parquet_dir`` (a table just written) as one CSV file with a header, in Python.

    Reading back the few KB to MB of a table with pyarrow costs milliseconds, where a
    Spark job per CSV copy costs a scheduling round each, and it formats the numbers as
    a person reads them (see :func:`csv_cell`).
    """
    import pyarrow.parquet as pq

    table = pq.read_table(parquet_dir)
    if csv_dir.exists():
        shutil.rmtree(csv_dir)
    csv_dir.mkdir(parents=True)
    with (csv_dir / "part-00000.csv").open("w", encoding="utf-8", newline="") as f:
        out = csvlib.writer(f)
        out.writerow(table.column_names)
        for batch in table.to_batches():
            for row in batch.to_pylist():
                out.writerow([csv_cell(v) for v in row.values()])
    (csv_dir / "_SUCCESS").touch()


def spark_csv(df: DataFrame, path: str) -> None:
    # Remote output: Spark writes it (the driver may not reach that storage directly).
    # Integral doubles are written without ".0", as in the local writer.
    cols = []
    for f in df.schema.fields:
        c = F.col(f.name)
        if isinstance(f.dataType, T.DoubleType):
            c = F.when(
                (c == F.floor(c)) & (F.abs(c) < F.lit(2.0**53)), c.cast("long").cast("string")
            ).otherwise(c.cast("string"))
        cols.append(c.alias(f.name))
    df.select(*cols).coalesce(1).write.mode("overwrite").option("header", "true").csv(path)


def write_rows(
    target: Path, schema: T.StructType, rows: list[dict[str, Any]], *, csv_dir: Path | None
) -> None:
    """``rows`` (Python values keyed by column) as one Parquet file of ``schema`` under
    ``target``, and as CSV under ``csv_dir`` when given: how a local output is written
    when the driver holds the table's rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    fresh(target)
    arrow = arrow_schema(schema)
    columns = {f.name: [r.get(f.name) for r in rows] for f in arrow}
    pq.write_table(pa.table(columns, schema=arrow), target / "part-00000.parquet")
    (target / "_SUCCESS").touch()
    if csv_dir is not None:
        write_local_csv(target, csv_dir)


def write_json_lines(target: Path, rows: list[dict[str, Any]]) -> None:
    fresh(target)
    with (target / "part-00000.json").open("w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    (target / "_SUCCESS").touch()


def fresh(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)


def arrow_schema(schema: T.StructType) -> Any:
    import pyarrow as pa

    kinds = {
        T.StringType: pa.string(),
        T.LongType: pa.int64(),
        T.DoubleType: pa.float64(),
        T.BooleanType: pa.bool_(),
        T.TimestampType: pa.timestamp("us", tz="UTC"),
        T.DateType: pa.date32(),
    }
    return pa.schema([pa.field(f.name, kinds[type(f.dataType)]) for f in schema.fields])


def from_json(value: object, kind: Any) -> object:
    import pyarrow as pa

    if value is None:
        return None
    if pa.types.is_timestamp(kind):
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    if pa.types.is_date32(kind):
        return datetime.fromisoformat(str(value)).date()
    if pa.types.is_floating(kind):
        return float(value)  # type: ignore[arg-type]
    return value


def write_summary(
    spark: SparkSession | None, summary: dict[str, float], out: str, *, csv: bool, local: bool
) -> None:
    if local or spark is None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        target = Path(f"{out}/summary")
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        table = pa.table(
            {
                "metric": pa.array(list(summary), pa.string()),
                "value": pa.array(list(summary.values()), pa.float64()),
            }
        )
        pq.write_table(table, target / "part-00000.parquet")
        (target / "_SUCCESS").touch()
        if csv:
            write_local_csv(target, Path(f"{out}/csv/summary"))
        return
    rows = spark.createDataFrame(list(summary.items()), S.SUMMARY_SCHEMA)
    rows.coalesce(1).write.mode("overwrite").parquet(f"{out}/summary")
    if csv:
        spark_csv(rows, f"{out}/csv/summary")


def write_provenance(spark: SparkSession | None, inputs: Inputs, out: str, *, local: bool) -> None:
    """``<out>/provenance.json``: what was read, and when and by what the tables were made
    (``engine``: ``spark``, with its version and master, or ``local`` without a session)."""
    record: dict[str, Any] = {
        "generated_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "input_format": inputs.fmt,
        "inputs": inputs.paths,
        "skipped": inputs.skipped,
        "engine": "local" if spark is None else "spark",
    }
    if spark is not None:
        record["spark"] = spark.version
        record["master"] = spark.sparkContext.master
    text = json.dumps(record, indent=2) + "\n"
    if local or spark is None:
        Path(f"{out}/provenance.json").write_text(text, encoding="utf-8")
    else:
        spark.createDataFrame([(text,)], "value string").coalesce(1).write.mode("overwrite").text(
            f"{out}/provenance"
        )
