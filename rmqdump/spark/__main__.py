"""``python -m rmqdump.spark`` / ``spark-submit .../rmqdump/spark/__main__.py``: the `rmqdump spark` commands.

Under spark-submit the session takes spark-submit's --master and --conf settings:

    spark-submit --master spark://host:7077 "$(python -c 'import rmqdump.spark.__main__ as m; print(m.__file__)')" \\
        export /data/broker-a/store /data/broker-b/store --out /shared/export
"""

from __future__ import annotations

import sys


def main() -> None:
    from rmqdump.cli import main as cli_main

    cli_main(["spark", *sys.argv[1:]])


if __name__ == "__main__":
    main()
