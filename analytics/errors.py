"""Errors of the analytics package: one base class, caught once in :mod:`analytics.cli`."""

from __future__ import annotations


class AnalyticsError(Exception):
    """Base class: something the user can fix (bad argument, missing input, failed job)."""


class InputError(AnalyticsError):
    """The input path is missing, empty, or holds no churn log files."""


class OptionError(AnalyticsError):
    """A command-line option has a value the jobs cannot use (e.g. a bad time)."""


class JobError(AnalyticsError):
    """A Spark job failed; the message carries Spark's own one-line reason."""


class VocabularyError(AnalyticsError):
    """``mdeci/churnlog.py``, where the churn-log vocabulary is defined, is missing or
    does not define it as expected."""
