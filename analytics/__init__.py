"""Spark analytics over mdeci session churn logs. Reads only log files."""
