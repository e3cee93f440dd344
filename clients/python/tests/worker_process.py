"""A worker process for the tests that signal or kill one: works SERVICE at URL with
CONCURRENCY slots, each item taking SECONDS, and returns the item's payload as its result."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from fairway_client import Worker


def main() -> None:
    url, service, concurrency, seconds = sys.argv[1:5]

    def handle(item: dict[str, Any]) -> list[Any]:
        time.sleep(float(seconds))
        return [item["payload"]]

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    Worker(url, service=service, handler=handle, concurrency=int(concurrency), wait=5).run()


if __name__ == "__main__":
    main()
