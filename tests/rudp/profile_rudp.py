"""Profile one rudp run of the benchmark: CPU time, top entries by own time.

Run: ``.venv/bin/python -m tests.rudp.profile_rudp LOSS [MESSAGES]`` (1 KB messages through
the impairment proxy, as ``tests/rudp/test_bench.py`` sends them). cProfile counts CPU
time (``time.process_time``), so the machine's load does not inflate the entries.
"""

from __future__ import annotations

import asyncio
import cProfile
import pstats
import sys
import time
from functools import partial

from tests.rudp.test_bench import measure, run_rudp


async def main(loss: float, n: int) -> None:
    profile = cProfile.Profile(time.process_time)
    profile.enable()
    clock = await measure(partial(run_rudp, 1024, n, loss))
    profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(15)
    if clock is None:
        print("timed out")
    else:
        print(f"{n / clock.wall:.0f} msg/s, {clock.cpu * 10_000 / n:.2f} CPU s / 10k; {clock.note}")


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 3000))
