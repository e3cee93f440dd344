"""A worker process for the tests that signal or kill one: works SERVICE at URL (one broker,
or several comma-separated) with CONCURRENCY slots, each item taking SECONDS, and returns the
item's payload as its result. An optional fifth argument is the long polls' WAIT in seconds (5
by default); an optional sixth is a file to which each run of an item adds ``start ID`` as it
starts and ``done ID`` as it ends."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from fairway_client import Worker


def main() -> None:
    url, service, concurrency, seconds = sys.argv[1:5]
    wait = float(sys.argv[5]) if len(sys.argv) > 5 else 5.0
    runs = sys.argv[6] if len(sys.argv) > 6 else None

    def record(line: str) -> None:
        if runs is not None:
            with open(runs, "a") as file:
                file.write(line + "\n")

    def handle(item: dict[str, Any]) -> list[Any]:
        record(f"start {item['id']}")
        time.sleep(float(seconds))
        record(f"done {item['id']}")
        return [item["payload"]]

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    Worker(url, service=service, handler=handle, concurrency=int(concurrency), wait=wait).run()


if __name__ == "__main__":
    main()
