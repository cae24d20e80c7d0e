"""Parsing the churn log: raw lines or typed records into valid events and quarantined lines.

Raw lines (``value``, ``source``) are parsed against the churn-log schema
(:func:`parse_lines`, or :func:`parse_records` for Parquet copies); each row then either
carries a reason it is not a valid record (:func:`quarantine`) or is an event
(:func:`valid_events`, which also drops exact duplicates).
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from analytics import schema as S

# Why a line is quarantined, in the order the checks run (the local engine gives the same).
NOT_A_RECORD = "not a JSON object with the churn-log field types"
MISSING_TS = "missing ts"
BAD_TS = "ts is not an RFC 3339 time"
MISSING_EVENT = "missing event"
UNKNOWN_EVENT = "unknown event"
MISSING_URI = "missing uri"


def conform(df: DataFrame, schema: T.StructType) -> DataFrame:
    """``df`` with exactly the columns of ``schema``, in its order and of its types.

    A column that already has its type is selected as it is, not cast and renamed: the
    new name would hide that it is the same column from what Spark knows of the
    partitioning (see :func:`valid_events`).
    """
    have = {f.name: f.dataType for f in df.schema.fields}
    return df.select(
        [
            F.col(f.name)
            if have.get(f.name) == f.dataType
            else F.col(f.name).cast(f.dataType).alias(f.name)
            for f in schema.fields
        ]
    )


def parse_lines(lines: DataFrame, *, keep_extra: bool = False) -> DataFrame:
    """Parse raw lines (columns ``value`` and ``source``) into records or errors.

    Blank lines are skipped (a trailing newline is not a record). The result has the
    churn-log fields, ``ts_ms``, ``extra``, ``error`` (null for a valid record), ``line``
    (the raw text, kept for invalid lines only, so that caching the result does not hold
    a second copy of the log) and ``source``.

    Unknown fields never make a line invalid. With ``keep_extra`` they are collected in
    ``extra``, a JSON object as text; that parses every line a second time, which costs
    about 40 % of the parse, so it is off unless asked for; ``extra`` is then null.
    """
    text = F.col("value")
    rec = F.from_json(
        text,
        S.CHURN_PARSE_SCHEMA,
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": S.CORRUPT_COLUMN},
    )
    map_type = T.MapType(T.StringType(), T.StringType())
    known = list(S.FIELD_NAMES)
    extra = (
        F.to_json(F.map_filter(F.from_json(text, map_type), lambda k, _v: ~k.isin(*known)))
        if keep_extra
        else F.lit(None).cast("string")
    )
    parsed = lines.where(F.trim(text) != "").select(
        text.alias("_line"), F.col("source"), rec.alias("r"), extra.alias("extra")
    )
    corrupt = F.col("r").isNull() | F.col(f"r.{S.CORRUPT_COLUMN}").isNotNull() | _barrier()
    fields = [F.col(f"r.{name}").alias(name) for name in S.FIELD_NAMES]
    return _validate(
        parsed.select(
            *fields, _ts_ms(F.col("r.ts")), "extra", "_line", "source", corrupt.alias("_bad")
        )
    )


def parse_records(records: DataFrame) -> DataFrame:
    """Parse typed records (a Parquet copy of the log) into the shape of :func:`parse_lines`.

    Missing churn-log columns are read as null; other columns become ``extra``.
    """
    present = {f.name: f.dataType for f in records.schema.fields}
    fields = [
        F.col(name)
        if present.get(name) == dtype
        else (F.col(name) if name in present else F.lit(None)).cast(dtype).alias(name)
        for name, dtype in S.CHURN_FIELDS
    ]
    others = [c for c in records.columns if c not in S.FIELD_NAMES and c != "source"]
    extra = (
        F.to_json(F.struct(*[F.col(c) for c in others])) if others else F.lit(None).cast("string")
    )
    source = F.col("source") if "source" in present else F.lit(None).cast("string")
    line = F.to_json(F.struct(*[F.col(c) for c in records.columns if c != "source"]))
    return _validate(
        records.select(
            *fields,
            extra.alias("extra"),
            line.alias("_line"),
            source.alias("source"),
            _ts_ms((F.col("ts") if "ts" in present else F.lit(None)).cast("string")),
            _barrier().alias("_bad"),
        )
    )


def _barrier() -> Column:
    """False, but non-deterministic: a projection holding it stops the optimizer from
    pushing the later filters on ``error`` below it, where each reference to a parsed
    field (a ``from_json`` of the line) or to ``ts_ms`` (a timestamp parse) would be
    computed once more per line."""
    return F.spark_partition_id() < 0


def _ts_ms(ts: Column) -> Column:
    """Epoch milliseconds of the RFC 3339 text ``ts``; null if it is not one."""
    return F.unix_millis(F.try_to_timestamp(ts)).alias("ts_ms")


def _validate(df: DataFrame) -> DataFrame:
    error = (
        F.when(F.col("_bad"), F.lit(NOT_A_RECORD))
        .when(F.col("ts").isNull(), F.lit(MISSING_TS))
        .when(F.col("ts_ms").isNull(), F.lit(BAD_TS))
        .when(F.col("event").isNull(), F.lit(MISSING_EVENT))
        .when(~F.col("event").isin(*S.EVENTS), F.lit(UNKNOWN_EVENT))
        .when(F.col("uri").isNull() | (F.trim(F.col("uri")) == ""), F.lit(MISSING_URI))
    )
    return df.select(
        *S.FIELD_NAMES,
        "ts_ms",
        "extra",
        error.alias("error"),
        F.when(error.isNotNull(), F.col("_line")).alias("line"),
        "source",
    )


def quarantine(parsed: DataFrame) -> DataFrame:
    """The lines of ``parsed`` that are not valid records, with why and where from."""
    bad = parsed.where(F.col("error").isNotNull())
    return conform(
        bad.select("line", F.col("error").alias("_reason"), "source").withColumnRenamed(
            "_reason", "reason"
        ),
        S.QUARANTINE_SCHEMA,
    )


def valid_events(parsed: DataFrame) -> DataFrame:
    """The valid records of ``parsed``; exact duplicates (every field, unknown ones too)
    are kept once."""
    ok = conform(parsed.where(F.col("error").isNull()), S.EVENT_SCHEMA)
    # Partitioned by user first: that one shuffle also serves the de-duplication (whose
    # keys begin with the same user) and every later per-user window and aggregate,
    # which then need no shuffle of their own when the result is cached. Every column is
    # a key (``extra`` is JSON text, not a map, for that reason): with no aggregate
    # buffer left, Spark de-duplicates in a hash table instead of sorting every row.
    # The columns keep their identity through ``conform`` and the parse (no cast and
    # alias of a column that has its type already): a result held as rows
    # (churn._Held) then still says it is partitioned by this ``uri``.
    return ok.repartition("uri").dropDuplicates(ok.columns)
