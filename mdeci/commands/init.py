"""``mdeci init --dest DIR``: write the sample configs the package carries into DIR.

The wheel carries ``broker.toml``, ``agent.toml``, ``kamailio.cfg``, ``kannel.conf``, the
Grafana dashboard and the systemd units (``systemd/*.service``), the files of the
repository's ``configs/``. An existing file is left alone unless ``--force``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator
from importlib.resources import files
from importlib.resources.abc import Traversable
from pathlib import Path, PurePosixPath

from mdeci.commands import Command
from mdeci.errors import ConfigError

PRIVATE = (".toml", ".conf")  # may hold passwords: owner only
Found = Iterator[tuple[PurePosixPath, Traversable]]


def samples() -> Found:
    """Every sample file: its path relative to the samples folder, and the resource."""

    def walk(
        folder: Traversable, rel: PurePosixPath
    ) -> Iterator[tuple[PurePosixPath, Traversable]]:
        for item in sorted(folder.iterdir(), key=lambda t: t.name):
            if item.is_dir():
                yield from walk(item, rel / item.name)
            elif not item.name.startswith(".") and item.name != "__init__.py":
                yield rel / item.name, item

    yield from walk(files("mdeci") / "samples", PurePosixPath())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dest", type=Path, required=True, help="folder to write them into")
    parser.add_argument("--force", action="store_true", help="overwrite existing files")


def run(args: argparse.Namespace) -> int:
    """Raises :class:`ConfigError` (one line, exit 2): a file exists, a write fails."""
    dest: Path = args.dest
    chosen = list(samples())
    if not chosen:
        raise ConfigError("this installation carries no sample configs")
    if not args.force:
        there = [str(dest / rel) for rel, _ in chosen if (dest / rel).exists()]
        if there:
            raise ConfigError(f"{there[0]} exists (and {len(there) - 1} more): use --force")
    for rel, item in chosen:
        target = dest / rel
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(item.read_bytes())
            os.chmod(target, 0o600 if target.suffix in PRIVATE else 0o644)
        except OSError as exc:
            raise ConfigError(f"cannot write {target}: {exc.strerror}") from None
        print(f"wrote {target}")
    print(
        f"next: set data_dir in {dest / 'broker.toml'} and state_dir in {dest / 'agent.toml'} "
        "(absolute paths, e.g. /var/lib/mdeci), replace the demo passwords, then "
        f"`mdeci check --config {dest / 'broker.toml'}` (docs/operations.md)"
    )
    return 0


COMMANDS = {"init": Command("init", add_arguments, run)}
