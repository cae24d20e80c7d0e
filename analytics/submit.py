"""Driver file for ``spark-submit`` (which runs a file, not a console script).

    spark-submit --master yarn --py-files analytics.zip analytics/submit.py \\
        churn --input hdfs:///logs/churn --output hdfs:///analytics/churn

``spark-submit`` sets the master, and ``churn`` keeps it because ``--master`` is not given.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from analytics import cli


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` as ``mdeci analytics`` would and run the step."""
    parser = argparse.ArgumentParser(prog="analytics", description="mdeci churn analytics")
    cli.add_arguments(parser)
    return cli.run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
