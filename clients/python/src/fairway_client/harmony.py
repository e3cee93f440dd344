"""``fairway-harmony``: runs an unchanged Harmony service adapter (a ``BaseHarmonyAdapter``
subclass of harmony-service-lib) as a fairway worker, as Harmony runs it.

Each work item's payload carries the Harmony message and the input STAC catalog, and may give
each step of the job its own operations::

    {"message": {...the Harmony message...}, "catalog": "file:///data/in/catalog.json",
     "steps": [{"operations": ["spatialSubset"]}, {"operations": ["reproject"]}]}

A first step's item reads ``catalog``. A chained step's item reads its ``inputs``, the output
catalogs of the item it was made from (its payload is its parent's); an aggregating step's
item gets every output catalog of the step before, which the runner links into one catalog of
all their STAC items, and the payload the step before ran with, written beside each output
catalog as ``fairway-payload.json``. The runner invokes the adapter as Harmony does:
harmony-service-lib's own command line (``--harmony-action invoke --harmony-input-file ...
--harmony-sources ... --harmony-metadata-dir ...``), in a process of its own per item. It
reports the output catalog's location (each one, for an adapter that returns several) as the
item's results, so that the next step receives them.

**What the service is handed.** As Harmony hands each step of a chain only that step's
``operations`` (the list its services.yml gives the step), the item of step N gets the message
less what belongs to the operations ``steps[N].operations`` does not list, with Harmony's own
rules (``DataOperation.serialize``): without ``reproject`` no ``format.crs``, ``format.srs``,
``format.interpolation``, ``format.scaleExtent``; without ``reformat`` no ``format.mime``;
without ``variableSubset`` no ``variables`` in any source; without ``spatialSubset``,
``shapefileSubset`` or ``dimensionSubset`` no ``subset.bbox``, ``subset.shape`` or
``subset.dimensions``; without ``temporalSubset`` no ``temporal``. A step that ``steps`` does
not list, or lists with no ``operations`` (or an empty list), gets the whole message, as in
Harmony. Its ``stagingLocation`` is the message's own plus ``ITEM/ATTEMPT/`` (the item's id
and attempt, with the trailing slash harmony-service-lib's ``stage`` appends file names to),
and so is ``--data-location``: no two items, steps or attempts write the same path, however
fixed the service's output names. A message without ``stagingLocation`` stages where
harmony-service-lib puts it (``STAGING_BUCKET``/``STAGING_PATH``).

**How an invocation ends.** Harmony's retry rules, mapped onto the job's retry policy. What
each exception of harmony-service-lib 3.0.0 (``harmony_service_lib.exceptions``) makes of the
item (the README has this as a table):

- ``NoRetryException`` (category ``NoRetry``), or any ``HarmonyException`` whose ``category``
  is ``noretry`` in any case: failed for good (``retryable: false``), with its message.
- ``NoDataException`` (category ``NoData``, level ``Warning``), or any ``HarmonyException`` of
  level ``warning``: successful with no results, its message the item's ``warning``; the step
  after gets nothing from it.
- ``ServerException`` (a download's 5xx, a 503 say, once harmony-service-lib's own retries are
  spent), ``ForbiddenException``, ``CanceledException``, a ``HarmonyException`` of any other
  category (``Service``, its default): failed, retryable, so the job's retry policy applies.
- Any other exception, or a process that dies without saying why (killed for its memory):
  failed, retryable.
- ``SystemExit`` (harmony-service-lib refused its arguments), or a payload not of the shape
  above: failed for good.

An aggregating item with no inputs (no item of the step before made output) succeeds with no
results and a warning, without running the service, as Harmony then aggregates nothing.

Harmony retries a failed work item up to ``WORK_ITEM_RETRY_LIMIT`` (5) times. fairway retries
by the job's policy (by the broker's ``--max-retries`` without one): submit Harmony jobs with
``retry=HARMONY_RETRY``, ``{"max_attempts": 5}`` with exponential backoff.

**Logs.** The service logs as ``APP_NAME``, which the runner sets to the ``--service`` name
unless the environment sets it. harmony-service-lib's warning that ``SHARED_SECRET_KEY`` is
unset is not repeated for every item: an item warns once, and only when the service downloads
an ``http(s)`` asset, which needs the message's ``accessToken`` (the user's Earthdata Login
token, encrypted with ``SHARED_SECRET_KEY``, as Harmony sends it).

**Cancels.** The worker heartbeats each item every ``--heartbeat`` seconds (5, and at most
half the lease); when the broker refuses a heartbeat (the job was canceled, or the lease was
lost) the service's process group is killed at once and the worker takes other work.

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
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from . import _core
from ._errors import FairwayError, PermanentError
from .worker import STOP_TIMEOUT, Succeeded, Worker

log = logging.getLogger("fairway_client.harmony")

#: The module the runner starts, per item, to invoke the adapter.
INVOKER = "fairway_client._harmony_invoke"

#: The payload an invocation ran with (its whole message and its ``steps``), written beside its
#: output catalogs for the aggregating step after it, whose item has no payload.
#: (harmony-service-lib's own message.json there is the message less the operations the
#: service marked done, and only on local disks.)
PAYLOAD_FILE = "fairway-payload.json"

#: The retry policy to submit Harmony jobs with: Harmony retries a failed work item up to
#: ``WORK_ITEM_RETRY_LIMIT`` (5) times; here with a backoff, so that a store that is briefly
#: down is not hammered.
HARMONY_RETRY: _core.RetryPolicy = {
    "max_attempts": 5,
    "backoff": "exponential",
    "initial": "5s",
    "max": "2m",
}

#: The warning of an aggregating item with no inputs, which succeeds without running the service.
NOTHING_TO_AGGREGATE = "nothing to aggregate: no item of the step before made output"

#: ``--heartbeat``'s default, in seconds: how soon a canceled job's service process is killed.
DEFAULT_HEARTBEAT = 5.0

#: What of the message each of Harmony's operations owns, as Harmony's
#: ``DataOperation.serialize`` strips it from a step that does not list the operation.
OPERATION_FIELDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "reproject": (
        ("format", "crs"),
        ("format", "srs"),
        ("format", "interpolation"),
        ("format", "scaleExtent"),
    ),
    "reformat": (("format", "mime"),),
    "variableSubset": (("sources", "*", "variables"),),
    "spatialSubset": (("subset", "bbox"),),
    "shapefileSubset": (("subset", "shape"),),
    "dimensionSubset": (("subset", "dimensions"),),
    "temporalSubset": (("temporal",),),
}


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


def item_staging(location: str, item_id: Any, attempt: Any) -> str:
    """Where one attempt of one item stages its output: ``location``/ITEM/ATTEMPT/, ending in
    the slash harmony-service-lib's ``stage`` appends file names to."""
    if is_url(location):
        return f"{location.rstrip('/')}/{item_id}/{attempt}/"
    return os.path.join(location, str(item_id), str(attempt), "")


def step_operations(steps: Any, step: int) -> list[str] | None:
    """The operations a payload's ``steps`` gives step ``step``, or None when it gives it none
    (the whole message); ValueError when ``steps`` is not ``[{"operations": [...]}, ...]``."""
    if steps is None:
        return None
    shape = 'the payload\'s steps must be [{"operations": ["spatialSubset", ...]}, ...]'
    if not isinstance(steps, list):
        raise ValueError(shape)
    if step >= len(steps) or steps[step] is None:
        return None
    entry = steps[step]
    if not isinstance(entry, dict):
        raise ValueError(f"{shape}; step {step} is {json.dumps(entry)[:100]}")
    operations = entry.get("operations")
    if operations is None:
        return None
    if not isinstance(operations, list) or not all(isinstance(op, str) for op in operations):
        raise ValueError(f"{shape}; step {step}'s operations are {json.dumps(operations)[:100]}")
    return operations


def step_message(message: dict[str, Any], operations: Sequence[str] | None) -> dict[str, Any]:
    """``message`` as Harmony sends it to a step that does ``operations``: without the fields of
    every operation it does not list (:data:`OPERATION_FIELDS`). None or an empty list: the
    whole message, as in Harmony."""
    result: dict[str, Any] = json.loads(json.dumps(message))
    if not operations:
        return result
    for operation, fields in OPERATION_FIELDS.items():
        if operation in operations:
            continue
        for field in fields:
            _remove(result, field)
    return result


def _remove(document: Any, path: tuple[str, ...]) -> None:
    head, rest = path[0], path[1:]
    if head == "*":
        for each in document if isinstance(document, list) else []:
            _remove(each, rest)
    elif isinstance(document, dict):
        if not rest:
            document.pop(head, None)
        elif head in document:
            _remove(document[head], rest)


def service_message(
    payload: dict[str, Any], step: int, item_id: Any, attempt: Any
) -> dict[str, Any]:
    """The message the service is handed for one attempt of one item of step ``step``: the
    step's operations only, staged under the item and the attempt."""
    message = step_message(payload["message"], step_operations(payload.get("steps"), step))
    staging = message.get("stagingLocation")
    if isinstance(staging, str) and staging:
        message["stagingLocation"] = item_staging(staging, item_id, attempt)
    return message


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
    """A :class:`~fairway_client.Worker` handler that runs one Harmony invocation per item.
    ``app_name`` is the ``APP_NAME`` the service logs as, unless the environment sets one (by
    default the adapter's module)."""

    def __init__(
        self,
        adapter: str,
        artifacts: str,
        *,
        data_location: str | None = None,
        python: str = sys.executable,
        app_name: str | None = None,
    ) -> None:
        self.adapter = adapter
        self.artifacts = artifacts
        self.data_location = data_location
        self.python = python
        self.app_name = app_name or adapter.partition(":")[0]

    def task(self, item: dict[str, Any], workdir: Path) -> dict[str, Any]:
        """What the invoker process is to do for ``item``; PermanentError if the payload is not
        the documented shape."""
        payload = item.get("payload")
        inputs = item.get("inputs") or []
        step = int(item.get("step") or 0)
        whole: dict[str, Any] | None = None
        if payload is None and inputs:
            # An aggregating step's item has no payload: it is the one the step before ran
            # with, written beside its output catalogs.
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
            whole = {"message": message}
            if payload.get("steps") is not None:
                whole["steps"] = payload["steps"]
            try:
                step_operations(whole.get("steps"), step)
            except ValueError as error:
                raise PermanentError(str(error)) from None
            if not inputs:
                inputs = [payload.get("catalog")]
        if not all(isinstance(each, str) and each for each in inputs):
            raise PermanentError(
                "no input catalog: the payload's catalog (first step) or the item's inputs "
                "(a chained step) must be catalog locations"
            )
        item_id, attempt = str(item["id"]), str(item["attempt"])
        outputs = join_location(self.artifacts, str(item["job_id"]), item_id, attempt, "outputs")
        data_location = self.data_location
        if data_location:
            data_location = item_staging(data_location, item_id, attempt)
        return {
            "adapter": self.adapter,
            "payload": whole,
            "payload_from": sibling(inputs[0], PAYLOAD_FILE),
            "step": step,
            "item": item_id,
            "attempt": attempt,
            "inputs": inputs,
            "outputs": outputs,
            "data_location": data_location,
            "workdir": str(workdir),
        }

    async def __call__(self, item: dict[str, Any]) -> list[str] | Succeeded:
        if item.get("payload") is None and not item.get("inputs") and item.get("step"):
            # An aggregating step's item over a step none of whose items made output (each
            # found no data, say): as in Harmony, there is nothing to aggregate.
            return Succeeded([], warning=NOTHING_TO_AGGREGATE)
        workdir = Path(tempfile.mkdtemp(prefix=f"fairway-harmony-{item['id']}-"))
        try:
            task_file = workdir / "task.json"
            task_file.write_text(json.dumps(self.task(item, workdir)))
            env = dict(os.environ)
            # harmony-service-lib's app_name, which its logs carry as `application`, is
            # APP_NAME, else the command's path: the invoker's, not the service's.
            if not env.get("APP_NAME"):
                env["APP_NAME"] = self.app_name
            process = await asyncio.create_subprocess_exec(
                self.python, "-m", INVOKER, str(task_file), start_new_session=True, env=env
            )
            try:
                code = await process.wait()
            except asyncio.CancelledError:
                # The item is no longer this worker's (canceled, or its lease expired): the
                # service and whatever it started go at once.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
                log.info("item %s: killed its service process %d", item["id"], process.pid)
                raise
            return self.outcome(workdir / "outcome.json", code)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    @staticmethod
    def outcome(path: Path, code: int) -> list[str] | Succeeded:
        """The output catalogs the invoker wrote (with its warning, if any), or its error
        raised."""
        try:
            outcome = json.loads(path.read_text())
        except (OSError, ValueError):
            raise RuntimeError(f"the adapter's process exited with {code} and no outcome") from None
        if outcome.get("catalogs") is not None and code == 0:
            catalogs = [str(catalog) for catalog in outcome["catalogs"]]
            if outcome.get("warning"):
                return Succeeded(catalogs, warning=str(outcome["warning"]))
            return catalogs
        error = str(outcome.get("error") or f"the adapter's process exited with {code}")
        if outcome.get("retryable", True):
            raise RuntimeError(error)
        raise PermanentError(error)


class QuietConfig(logging.Filter):
    """Drops what harmony-service-lib's ``config()`` logs each time it is built (twice per
    invocation): the warning that ``SHARED_SECRET_KEY`` is unset, which the invoker gives once
    and only when an ``http`` download needs the key, and the configuration itself, key
    included."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.msg
        if isinstance(message, str):
            return not message.startswith("The SHARED_SECRET_KEY has not been set")
        return type(message).__name__ != "Config"


@contextlib.contextmanager
def quiet_config_logs() -> Iterator[None]:
    quiet = QuietConfig()
    root = logging.getLogger()
    root.addFilter(quiet)
    try:
        yield
    finally:
        root.removeFilter(quiet)


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
        with quiet_config_logs():
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
        "--url",
        default=env("FAIRWAY_URL"),
        help="the broker, or several comma-separated: a request moves on to the next while one "
        f"refuses the connection or answers 503 (FAIRWAY_URL; {_core.DEFAULT_URL})",
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
        help="passed as --harmony-data-location, under ITEM/ATTEMPT/: overrides the message's "
        "stagingLocation",
    )
    parser.add_argument(
        "--heartbeat",
        type=float,
        default=DEFAULT_HEARTBEAT,
        help="seconds between heartbeats of an item being worked, at most half the lease: a "
        f"canceled job's service is killed at the next one ({DEFAULT_HEARTBEAT:g})",
    )
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=STOP_TIMEOUT,
        help="seconds the worker goes on after SIGTERM, finishing the items it holds and "
        "delivering their reports, before it exits 1 naming those it could not report; keep it "
        f"under the pod's termination grace period ({STOP_TIMEOUT:g})",
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
    handler = HarmonyHandler(
        args.adapter, args.artifacts, data_location=args.data_location, app_name=args.service
    )
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
            heartbeat=args.heartbeat,
            stop_timeout=args.stop_timeout,
        )
    except ValueError as error:
        print(f"fairway-harmony: {error}", file=sys.stderr)
        return 2
    try:
        worker.run()
    except FairwayError as error:
        log.error("the broker refused this worker's claims: %s", error)
        return 1
    # Stopped with reports undelivered, as `fairway worker` does.
    return 1 if worker.unreported else 0


if __name__ == "__main__":
    sys.exit(main())
