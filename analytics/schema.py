"""Explicit schemas: the churn-log record (docs/protocol.md §8) and every output table.

The field names of :data:`CHURN_SCHEMA` are the contract with the broker and the agents;
nothing is inferred from the data, so a log with a stray type in one line cannot change
the type of a column for every other line (it becomes a quarantined line instead).
"""

from __future__ import annotations

from pyspark.sql import types as T

from analytics.vocabulary import VOCABULARY

# The churn-log vocabulary, in the order of docs/protocol.md §8, as mdeci/churnlog.py
# defines it (read from there: analytics/vocabulary.py).
EVENTS: tuple[str, ...] = VOCABULARY.events

# Which role's line is the fact for each event (docs/protocol.md §8). The broker holds the
# registrar, the dialogs, the queues and the acks; only a device sees its address change
# and knows what its gate refused or missed. A line of the other role is the same fact
# seen from the other end and is not counted; a line with no role (a log from before the
# field) is counted as it is.
AGENT_EVENTS: tuple[str, ...] = VOCABULARY.agent_events
AUTHORITY: dict[str, str] = {e: ("agent" if e in AGENT_EVENTS else "broker") for e in EVENTS}
ROLES: tuple[str, ...] = ("broker", "agent")

_TYPES: dict[str, T.DataType] = {
    "text": T.StringType(),
    "count": T.LongType(),
    "number": T.DoubleType(),
}

# Fields of one churn-log line, exactly as docs/protocol.md §8 names and types them.
CHURN_FIELDS: tuple[tuple[str, T.DataType], ...] = (
    ("ts", T.StringType()),
    ("node", T.StringType()),
    ("role", T.StringType()),
    ("event", T.StringType()),
    ("uri", T.StringType()),
    *((name, _TYPES[kind]) for name, kind in VOCABULARY.fields),
)

FIELD_NAMES: tuple[str, ...] = tuple(name for name, _ in CHURN_FIELDS)

CHURN_SCHEMA = T.StructType([T.StructField(name, dtype, True) for name, dtype in CHURN_FIELDS])

CORRUPT_COLUMN = "_corrupt_record"

# The parser's schema: the record plus the column Spark fills with lines it cannot read.
CHURN_PARSE_SCHEMA = T.StructType(
    [*CHURN_SCHEMA.fields, T.StructField(CORRUPT_COLUMN, T.StringType())]
)


def _schema(*fields: tuple[str, T.DataType]) -> T.StructType:
    return T.StructType([T.StructField(name, dtype, True) for name, dtype in fields])


_L = T.LongType()
_D = T.DoubleType()
_S = T.StringType()
_TS = T.TimestampType()
_B = T.BooleanType()

# A valid, de-duplicated event: the record, its instant in epoch milliseconds, and the
# unknown fields of its line as a JSON object in text (kept, as docs/protocol.md asks, when
# asked for; no job reads them).
EVENT_SCHEMA = T.StructType(
    [
        *CHURN_SCHEMA.fields,
        T.StructField("ts_ms", _L, True),
        T.StructField("extra", _S, True),
    ]
)

QUARANTINE_SCHEMA = _schema(("line", _S), ("reason", _S), ("source", _S))

# start/end are the episode's true edges (end null while open); window_start/window_end
# and duration are clipped to the time window the job was asked for.
EPISODE_SCHEMA = _schema(
    ("uri", _S),
    ("start_ms", _L),
    ("end_ms", _L),
    ("window_start_ms", _L),
    ("window_end_ms", _L),
    ("duration_ms", _L),
    ("open", _B),
)

PER_USER_SCHEMA = _schema(
    ("uri", _S),
    ("events", _L),
    ("address_changes", _L),
    ("handovers", _L),
    ("disconnections", _L),
    ("disconnected_ms", _L),
    ("longest_disconnection_ms", _L),
    ("restores", _L),
    ("restore_p50_ms", _D),
    ("restore_p95_ms", _D),
    ("restore_p99_ms", _D),
    ("sessions", _L),
    ("notify_queued", _L),
    ("notify_delivered", _L),
    ("notify_dropped", _L),
    ("sms_count", _L),
    ("sms_cost", _D),
    ("churn_score", _D),
)

PER_HOUR_SCHEMA = _schema(
    ("hour", _TS),
    ("active_users", _L),
    ("events", _L),
    ("address_changes", _L),
    ("handovers", _L),
    ("disconnections", _L),
    ("notify_dropped", _L),
    ("sms_count", _L),
    ("sms_cost", _D),
)

TRANSITION_SCHEMA = _schema(
    ("from_subnet", _S),
    ("to_subnet", _S),
    ("transitions", _L),
    ("users", _L),
)

LATENCY_SCHEMA = _schema(
    ("bucket_lo_ms", _D),
    ("bucket_hi_ms", _D),
    ("restores", _L),
    ("cumulative_fraction", _D),
)

FLAPPING_SCHEMA = _schema(
    ("uri", _S),
    ("start_ms", _L),
    ("end_ms", _L),
    ("changes", _L),
    ("peak_changes_in_window", _L),
)

STORM_SCHEMA = _schema(
    ("start_ms", _L),
    ("end_ms", _L),
    ("users", _L),
    ("reconnects", _L),
)

RECOMMENDATION_SCHEMA = _schema(
    ("setting", _S),
    ("value", _D),
    ("unit", _S),
    ("basis", _S),
)

SUMMARY_SCHEMA = _schema(("metric", _S), ("value", _D))

# The handover matrix: moves from one subnet to another, and how fast the session came
# back after them (the restore that followed each move).
HANDOVER_MATRIX_SCHEMA = _schema(
    ("from_subnet", _S),
    ("to_subnet", _S),
    ("handovers", _L),
    ("users", _L),
    ("restores", _L),
    ("restore_p50_ms", _D),
    ("restore_p95_ms", _D),
)

# Per network (subnet): the disconnections that began there, the restores that landed there.
NETWORK_SCHEMA = _schema(
    ("subnet", _S),
    ("disconnections", _L),
    ("users_disconnected", _L),
    ("restores", _L),
    ("restore_p50_ms", _D),
    ("restore_p95_ms", _D),
)

SMS_SPEND_SCHEMA = _schema(
    ("uri", _S),
    ("day", T.DateType()),
    ("sms_count", _L),
    ("sms_cost", _D),
)

# One row per move (Siena's Table 3): what followed it, charged to it (analytics/figures.py).
PER_MOVE_SCHEMA = _schema(
    ("uri", _S),
    ("ts_ms", _L),
    ("old_network", _S),
    ("new_network", _S),
    ("reason", _S),
    ("restore_ms", _D),
    ("lost", _L),
    ("duplicated", _L),
)

PER_DEVICE_SCHEMA = _schema(
    ("uri", _S),
    ("channel", _S),
    ("deliveries", _L),
    ("bytes", _L),
    ("cost", _D),
)

LATENCY_BY_NETWORK_SCHEMA = _schema(
    ("channel", _S),
    ("network", _S),
    ("deliveries", _L),
    ("p50_ms", _D),
    ("p95_ms", _D),
    ("p99_ms", _D),
    ("mean_ms", _D),
)

# Per user: the network decisions (``channel_decided``) against "always deliver now"
# (analytics/figures.py ``saved``).
SAVED_SCHEMA = _schema(
    ("uri", _S),
    ("decided", _L),
    ("waited", _L),
    ("bytes_moved", _L),
    ("cost_now", _D),
    ("cost_paid", _D),
    ("saved", _D),
)

PER_BROKER_SCHEMA = _schema(
    ("broker", _S),
    ("users", _L),
    ("sessions", _L),
    ("handoffs", _L),
    ("failovers", _L),
)
