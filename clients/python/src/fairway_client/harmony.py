"""``fairway-harmony``: runs an unchanged Harmony service adapter (a ``BaseHarmonyAdapter``
subclass of harmony-service-lib) as a fairway worker.

Each work item's payload carries the Harmony message and the input STAC catalog::

    {"message": {...the Harmony message...}, "catalog": "file:///data/in/catalog.json"}

A first step's item reads ``catalog``. A chained step's item reads its ``inputs``, the output
catalogs of the item it was made from; an aggregating step's item gets every output catalog of
the step before, which the runner links into one catalog of all their STAC items. The runner
invokes the adapter as Harmony does: harmony-service-lib's own command line
(``--harmony-action invoke --harmony-input-file ... --harmony-sources ...
--harmony-metadata-dir ...``), in a process of its own per item. It reports the output
catalog's location (each one, for an adapter that returns several) as the item's results, so
that the next step receives them.

Locations are local paths, ``file://`` URLs or ``s3://`` URLs; ``s3://`` goes through
harmony-service-lib as it does in Harmony. An adapter's ``stage()`` writes to a local or
``file://`` ``stagingLocation`` as it would upload to S3, so that a service runs without cloud
storage. Install with ``pip install "fairway-client[harmony]"``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from . import _core
from ._errors import FairwayError, PermanentError
from .worker import Worker

log = logging.getLogger("fairway_client.harmony")

#: The module the runner starts, per item, to invoke the adapter.
INVOKER = "fairway_client._harmony_invoke"

#: The message an invocation ran with, written beside its output catalogs for the aggregating
#: step after it, whose item has no payload. (harmony-service-lib's own message.json there is
#: the message less the operations the service marked done, and only on local disks.)
MESSAGE_FILE = "fairway-message.json"


def is_url(location: str) -> bool:
    return "://" in location


def local_path(location: str) -> str:
    """A ``file://`` URL as a local path; anything else as it is."""
    if location.startswith("file://"):
        return unquote(urlparse(location).path)
    return location


def join_location(base: str, *parts: str) -> str:
    """``base``/``parts``, for a local directory, a ``file://`` URL or an ``s3://`` prefix."""
    if is_url(base):
        return "/".join([base.rstrip("/"), *parts])
    return os.path.join(os.path.abspath(base), *parts)


def sibling(location: str, name: str) -> str:
    """The file ``name`` in the directory of ``location``."""
    if is_url(location):
        return location.rsplit("/", 1)[0] + "/" + name
    return os.path.join(os.path.dirname(os.path.abspath(location)), name)


def load_adapter(spec: str) -> type:
    """The class ``module:Class`` names."""
    module_name, _, class_name = spec.partition(":")
    if not module_name or not class_name:
        raise ValueError(f"--adapter must be module:Class, not {spec!r}")
    module = importlib.import_module(module_name)
    adapter = getattr(module, class_name, None)
    if not isinstance(adapter, type):
        raise ValueError(f"{module_name} has no class {class_name}")
    return adapter


class HarmonyHandler:
    """A :class:`~fairway_client.Worker` handler that runs one Harmony invocation per item."""

    def __init__(
        self,
        adapter: str,
        artifacts: str,
        *,
        data_location: str | None = None,
        python: str = sys.executable,
    ) -> None:
        self.adapter = adapter
        self.artifacts = artifacts
        self.data_location = data_location
        self.python = python

    def task(self, item: dict[str, Any], workdir: Path) -> dict[str, Any]:
        """What the invoker process is to do for ``item``; PermanentError if the payload is not
        the documented shape."""
        payload = item.get("payload")
        inputs = item.get("inputs") or []
        message: Any = None
        if payload is None and inputs:
            # An aggregating step's item has no payload: the message is the one the step
            # before ran with, written beside its output catalogs.
            pass
        elif not isinstance(payload, dict) or "message" not in payload:
            raise PermanentError('the payload is not {"message": {...}, "catalog": "..."}')
        else:
            message = payload["message"]
            if isinstance(message, str):
                try:
                    message = json.loads(message)
                except ValueError as error:
                    raise PermanentError(f"the payload's message is not JSON: {error}") from None
            if not isinstance(message, dict):
                raise PermanentError("the payload's message is not a JSON object")
            if not inputs:
                inputs = [payload.get("catalog")]
        if not all(isinstance(each, str) and each for each in inputs):
            raise PermanentError(
                "no input catalog: the payload's catalog (first step) or the item's inputs "
                "(a chained step) must be catalog locations"
            )
        outputs = join_location(
            self.artifacts, str(item["job_id"]), str(item["id"]), str(item["attempt"]), "outputs"
        )
        return {
            "adapter": self.adapter,
            "message": message,
            "message_from": sibling(inputs[0], MESSAGE_FILE),
            "inputs": inputs,
            "outputs": outputs,
            "data_location": self.data_location,
            "workdir": str(workdir),
        }

    async def __call__(self, item: dict[str, Any]) -> list[str]:
        workdir = Path(tempfile.mkdtemp(prefix=f"fairway-harmony-{item['id']}-"))
        try:
            task_file = workdir / "task.json"
            task_file.write_text(json.dumps(self.task(item, workdir)))
            process = await asyncio.create_subprocess_exec(
                self.python, "-m", INVOKER, str(task_file), start_new_session=True
            )
            try:
                code = await process.wait()
            except asyncio.CancelledError:
                # The item is no longer this worker's (canceled, or its lease expired).
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
                raise
            return self.outcome(workdir / "outcome.json", code)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    @staticmethod
    def outcome(path: Path, code: int) -> list[str]:
        """The output catalogs the invoker wrote, or its error raised."""
        try:
            outcome = json.loads(path.read_text())
        except (OSError, ValueError):
            raise RuntimeError(f"the adapter's process exited with {code} and no outcome") from None
        if outcome.get("catalogs") is not None and code == 0:
            return [str(catalog) for catalog in outcome["catalogs"]]
        error = str(outcome.get("error") or f"the adapter's process exited with {code}")
        if outcome.get("retryable", True):
            raise RuntimeError(error)
        raise PermanentError(error)


def check_harmony(adapter: str) -> str | None:
    """Why the runner cannot start, or None: harmony-service-lib, the adapter and the
    configuration harmony-service-lib validates are all there."""
    try:
        importlib.import_module("harmony_service_lib")
    except ImportError as error:
        return (
            f'harmony-service-lib is not installed ({error}): pip install "fairway-client[harmony]"'
        )
    try:
        adapter_class = load_adapter(adapter)
    except (ImportError, ValueError, AttributeError) as error:
        return f"cannot load the adapter {adapter}: {error}"
    from harmony_service_lib import BaseHarmonyAdapter
    from harmony_service_lib.util import config

    if not issubclass(adapter_class, BaseHarmonyAdapter):
        return f"{adapter} is not a BaseHarmonyAdapter subclass"
    try:
        config()
    except Exception as error:
        return (
            f"harmony-service-lib's configuration is incomplete: {error}. Harmony sets "
            "these for every service; for local files any value will do"
        )
    return None


def strategy(text: str) -> _core.Strategy:
    """``--strategy``: an expression is JSON, a leaf a bare name."""
    if text.lstrip().startswith("{"):
        try:
            expression: dict[str, Any] = json.loads(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(f"not a JSON expression: {error}") from None
        return expression
    return text


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fairway-harmony",
        description="Run a Harmony service adapter (harmony-service-lib) as a fairway worker.",
    )
    env = os.environ.get
    parser.add_argument(
        "--url", default=env("FAIRWAY_URL"), help=f"the broker (FAIRWAY_URL; {_core.DEFAULT_URL})"
    )
    parser.add_argument(
        "--token", default=env("FAIRWAY_TOKEN"), help="bearer token (FAIRWAY_TOKEN)"
    )
    parser.add_argument("--service", required=True, help="the fairway service whose items to work")
    parser.add_argument(
        "--adapter", required=True, help="the BaseHarmonyAdapter subclass, as module:Class"
    )
    parser.add_argument("--concurrency", type=int, default=1, help="items worked at once")
    parser.add_argument("--querier", help="querier name (default: host name and process id)")
    parser.add_argument(
        "--wait", type=float, default=20.0, help="seconds one work request waits (at most 60)"
    )
    parser.add_argument(
        "--strategy",
        type=strategy,
        help="claim strategy: a leaf's name (oldest) or a JSON expression (default: fair order)",
    )
    parser.add_argument(
        "--artifacts",
        default=env("FAIRWAY_HARMONY_ARTIFACTS", "fairway-harmony-artifacts"),
        help="where output catalogs go, under JOB/ITEM/ATTEMPT/outputs/: a directory, a file:// "
        "URL or an s3:// prefix (FAIRWAY_HARMONY_ARTIFACTS; ./fairway-harmony-artifacts)",
    )
    parser.add_argument(
        "--data-location",
        help="passed as --harmony-data-location: overrides the message's stagingLocation",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (INFO)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    level = logging.getLevelName(args.log_level.upper())
    if not isinstance(level, int):
        print(f"fairway-harmony: unknown --log-level {args.log_level}", file=sys.stderr)
        return 2
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # httpx logs every request at INFO: a line per long poll and per heartbeat.
    if level > logging.DEBUG:
        logging.getLogger("httpx").setLevel(logging.WARNING)
    # Adapters are named as `python -m` would find them: from the current directory too.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    problem = check_harmony(args.adapter)
    if problem is not None:
        print(f"fairway-harmony: {problem}", file=sys.stderr)
        return 2
    handler = HarmonyHandler(args.adapter, args.artifacts, data_location=args.data_location)
    try:
        worker = Worker(
            args.url,
            service=args.service,
            handler=handler,
            concurrency=args.concurrency,
            querier=args.querier,
            token=args.token,
            wait=args.wait,
            strategy=args.strategy,
        )
    except ValueError as error:
        print(f"fairway-harmony: {error}", file=sys.stderr)
        return 2
    try:
        worker.run()
    except FairwayError as error:
        log.error("the broker refused this worker's claims: %s", error)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
