"""Run sipp (Debian ``sip-tester``) as a child process on loopback and read its verdict."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.peers import free_port, require_binary

SCENARIOS = Path(__file__).parent / "scenarios"


@dataclass(frozen=True)
class SippResult:
    returncode: int
    successful: int
    failed: int
    output: str


def sipp_binary() -> str:
    return require_binary("sipp", "apt-get install sip-tester")


def _counts(screen: str) -> tuple[int, int]:
    ok = re.findall(r"Successful call\s*\|\s*\d+\s*\|\s*(\d+)", screen)
    bad = re.findall(r"Failed call\s*\|\s*\d+\s*\|\s*(\d+)", screen)
    return (int(ok[-1]) if ok else -1, int(bad[-1]) if bad else -1)


class Sipp:
    """One sipp process; ``wait`` returns counts parsed from its final screen."""

    def __init__(self, args: list[str], workdir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.workdir = workdir
        self.screen = workdir / f"sipp-{self.port}-screen.log"
        self.errors = workdir / f"sipp-{self.port}-errors.log"
        cmd = [
            sipp_binary(),
            *args,
            "-i", "127.0.0.1", "-p", str(self.port),
            "-trace_screen", "-screen_file", str(self.screen),
            "-trace_err", "-error_file", str(self.errors),
            "-nostdin",
        ]  # fmt: skip
        self.process = subprocess.Popen(
            cmd, cwd=workdir, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip

    def wait(self, timeout: float) -> SippResult:
        try:
            out, _ = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()  # ours, by PID
            out, _ = self.process.communicate()
        screen = self.screen.read_text(errors="replace") if self.screen.exists() else ""
        errors = self.errors.read_text(errors="replace") if self.errors.exists() else ""
        ok, bad = _counts(screen)
        return SippResult(self.process.returncode, ok, bad, out + screen + errors[-4000:])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(5)
