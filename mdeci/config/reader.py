"""The generic TOML reader: walks a dataclass's type hints to build it from a table,
refusing unknown keys and wrong types with a one-line :class:`ConfigError` naming the key."""

from __future__ import annotations

import dataclasses
import os
import tomllib
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any, Literal, TypeVar

from mdeci.config.common import HostPort
from mdeci.errors import ConfigError

T = TypeVar("T")

_TOML_TYPES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "a boolean",
    list: "an array",
    dict: "a table",
}


def _default(f: dataclasses.Field[Any]) -> Any:
    """The value a field takes when its key is left out (None when it has none)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _toml_type(value: object) -> str:
    for kind, name in _TOML_TYPES.items():
        if type(value) is kind:
            return name
    return type(value).__name__  # dates and times


UNREAD_SECRET = "(not read)"
"""The password of a user whose ``password_env`` a loader was told not to read."""


class _Reader:
    def __init__(
        self, source: str, folder: Path, env: typing.Mapping[str, str], *, secrets: bool = True
    ) -> None:
        self.source = source
        self.folder = folder
        self.env = env
        self.secrets = secrets

    def error(self, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {message}")

    def build(self, cls: type[T], table: dict[str, Any], prefix: str, base: Any = None) -> T:
        """``cls`` from ``table``; a key the table leaves out takes its value from ``base``
        (the field's default in the enclosing dataclass, e.g. the agent's ``[sip]`` has
        port 0) or, without one, the class default."""
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        secret = "password" in names
        for key in table:
            if key not in names and not (secret and key == "password_env"):
                raise self.error(f"unknown key '{prefix}{key}'")
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            key = prefix + f.name
            if f.name in table:
                kwargs[f.name] = self.convert(table[f.name], hints[f.name], key, _default(f))
            elif base is not None:
                kwargs[f.name] = getattr(base, f.name)
            if secret and f.name == "password":
                self.secret(table, prefix, kwargs)
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if required and f.name not in kwargs:
                raise self.error(f"missing key '{key}'")
        try:
            return cls(**kwargs)
        except ConfigError as exc:
            where = f"[{prefix.rstrip('.')}] " if prefix else ""
            raise self.error(f"{where}{exc}") from None
        except ValueError as exc:  # RudpConfig validates with ValueError
            where = f"[{prefix.rstrip('.')}] " if prefix else ""
            raise self.error(f"{where}{exc}") from None

    def secret(self, table: dict[str, Any], prefix: str, kwargs: dict[str, Any]) -> None:
        if "password_env" not in table:
            return
        if "password" in table:
            raise self.error(f"give '{prefix}password' or '{prefix}password_env', not both")
        var = self.convert(table["password_env"], str, prefix + "password_env")
        if not self.secrets:
            kwargs["password"] = UNREAD_SECRET
            return
        value = self.env.get(var)
        if not value:
            raise self.error(f"environment variable {var!r} ('{prefix}password_env') is not set")
        kwargs["password"] = value

    def convert(self, value: Any, hint: Any, key: str, default: Any = None) -> Any:
        origin = typing.get_origin(hint)
        if origin is Literal:
            literals = typing.get_args(hint)
            if value not in literals:
                choices = " or ".join(repr(a) for a in literals)
                raise self.error(f"key '{key}' must be {choices}, not {value!r}")
            return value
        if origin in (types.UnionType, typing.Union):
            (inner,) = [a for a in typing.get_args(hint) if a is not type(None)]
            return self.convert(value, inner, key, default)
        if origin is tuple:
            item_hint = typing.get_args(hint)[0]
            if not isinstance(value, list):
                raise self.wrong(key, "an array", value)
            return tuple(self.convert(v, item_hint, f"{key}[{i}]") for i, v in enumerate(value))
        if dataclasses.is_dataclass(hint) and hint is not HostPort:
            if not isinstance(value, dict):
                raise self.wrong(key, "a table", value)
            return self.build(hint, value, key + ".", default)  # type: ignore[arg-type]
        if hint is HostPort:
            if not isinstance(value, str):
                raise self.wrong(key, "a 'host:port' string", value)
            try:
                return HostPort.parse(value)
            except ConfigError as exc:
                raise self.error(f"key '{key}': {exc}") from None
        if isinstance(hint, type) and issubclass(hint, Enum):
            allowed = [m.value for m in hint]
            if value not in allowed:
                choices = " or ".join(repr(a) for a in allowed)
                raise self.error(f"key '{key}' must be {choices}, not {value!r}")
            return hint(value)
        if hint is Path:
            if not isinstance(value, str) or not value:
                raise self.wrong(key, "a path string", value)
            return _in(self.folder, Path(value).expanduser())
        if hint is bool:
            if not isinstance(value, bool):
                raise self.wrong(key, "a boolean", value)
            return value
        if hint is int:
            if not isinstance(value, int) or isinstance(value, bool):
                raise self.wrong(key, "an integer", value)
            return value
        if hint is float:
            if not isinstance(value, int | float) or isinstance(value, bool):
                raise self.wrong(key, "a number", value)
            return float(value)
        if hint is str:
            if not isinstance(value, str):
                raise self.wrong(key, "a string", value)
            return value
        raise AssertionError(f"config type {hint!r} not handled")  # a programming error

    def wrong(self, key: str, expected: str, value: object) -> ConfigError:
        return self.error(f"key '{key}' must be {expected}, not {_toml_type(value)}")


def _read_toml(path: Path, source: str) -> dict[str, Any]:
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source}: {str(exc).splitlines()[0]}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{source}: not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read ({exc.strerror})") from None


def _in(base: Path, path: Path) -> Path:
    """``path`` made absolute against ``base``, with ``..`` folded (symlinks kept)."""
    return Path(os.path.normpath(path if path.is_absolute() else base / path))


def _sqlite_in(data_dir: Path, url: str) -> str:
    scheme, sep, rest = url.partition(":///")
    if not sep or not scheme.startswith("sqlite"):
        return url
    file, q, query = rest.partition("?")
    if not file or file == ":memory:" or Path(file).is_absolute():
        return url
    return f"{scheme}:///{data_dir / file}{q}{query}"
