"""Run ``python -m sip registrar|uas`` as child processes and read their output lines."""

from __future__ import annotations

import queue
import re
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


class Tool:
    """A ``python -m sip`` child; its stdout lines are collected on a reader thread."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "sip", *args],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        first = self.expect(r"listening on (\S+):(\d+)", timeout=20)
        m = re.search(r"listening on (\S+):(\d+)", first)
        assert m is not None
        self.addr = (m.group(1), int(m.group(2)))

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))

    def expect(self, pattern: str, timeout: float = 10) -> str:
        """The next line matching ``pattern`` (lines before it are kept in ``seen``)."""
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no line matching {pattern!r}; saw {self.seen}") from None
            self.seen.append(line)
            if re.search(pattern, line):
                return line

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # ours, by PID
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
