"""The local engine: the churn tables of a small log computed in this process, no Spark.

A JVM and a SparkSession take longer to start than the whole computation on a log of a
few MB (an admin's first run on the demo's logs). This package computes the same tables
as :mod:`analytics.jobs`, :mod:`analytics.figures` and :mod:`analytics.recommend`, with
the same columns, types and row order, from the same definitions, over per-user lists
sorted in plain Python; :mod:`analytics.local.run` writes them through
:mod:`analytics.output` as the Spark path does. ``tests/analytics/test_engines.py``
runs both engines on the same logs and compares every table.
"""
