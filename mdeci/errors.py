"""Errors of the mdeci service; one base class so callers can catch the family."""


class MdeciError(Exception):
    """Base of every error the mdeci package raises on purpose."""


class ConfigError(MdeciError):
    """A configuration file or value is invalid; the message says which key and why."""
