"""One Harmony invocation, in a process of its own, as Harmony runs a service per work item:
``python -m fairway_client._harmony_invoke TASK``, where TASK is the JSON file
:class:`fairway_client.harmony.HarmonyHandler` wrote. It builds the input catalog, calls
harmony-service-lib's command line (``setup_cli`` and ``run_cli``) with the arguments Harmony
passes, and writes ``outcome.json`` beside TASK: the output catalogs (with a warning, for a
service that found no data), or the error and whether another attempt may help, as Harmony
decides from a ``HarmonyException``'s level and category."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

from .harmony import (
    PAYLOAD_FILE,
    QuietConfig,
    is_url,
    join_location,
    load_adapter,
    local_path,
    service_message,
    step_operations,
)


def sources_catalog(inputs: list[str], workdir: Path) -> str:
    """The catalog the adapter reads: the one input, or, for an aggregating step, a catalog
    linking every STAC item of every input catalog, in input order."""
    if len(inputs) == 1:
        return local_path(inputs[0])
    import pystac

    links: list[dict[str, Any]] = [
        {"rel": "root", "href": "./catalog.json", "type": "application/json"}
    ]
    for location in inputs:
        catalog = pystac.Catalog.from_file(local_path(location))
        try:
            stac_items = list(catalog.get_items(recursive=True))
        except TypeError:  # pystac before 1.8
            stac_items = list(catalog.get_all_items())
        for stac_item in stac_items:
            links.append(
                {"rel": "item", "href": stac_item.get_self_href(), "type": "application/json"}
            )
    aggregated = {
        "type": "Catalog",
        "stac_version": pystac.get_stac_version(),
        "id": f"fairway-aggregate-{workdir.name}",
        "description": f"every item of {len(inputs)} catalogs, aggregated by fairway-harmony",
        "links": links,
    }
    directory = workdir / "sources"
    directory.mkdir()
    (directory / "catalog.json").write_text(json.dumps(aggregated, indent=2))
    return str(directory / "catalog.json")


def output_catalogs(outputs: str, metadata_dir: str) -> list[str]:
    """Where the adapter's output catalogs are: each of ``batch-catalogs.json`` when it
    returned several, else ``catalog.json``."""
    names: list[str] | None = None
    batch = os.path.join(metadata_dir, "batch-catalogs.json")
    if is_url(metadata_dir):
        from harmony_service_lib.s3_stac_io import S3StacIO

        try:
            names = json.loads(S3StacIO().read_text(batch))
        except Exception:
            names = None
    elif os.path.exists(batch):
        names = json.loads(Path(batch).read_text())
    return [join_location(outputs, name) for name in (names or ["catalog.json"])]


class BadPayload(Exception):
    """The item's payload cannot be worked, whatever the attempt: an aggregating item whose
    inputs carry no payload beside them, or ``steps`` of the wrong shape."""


def read_text(location: str) -> str:
    if is_url(local_path(location)):
        from harmony_service_lib.s3_stac_io import S3StacIO

        return str(S3StacIO().read_text(location))
    return Path(local_path(location)).read_text()


def write_text(location: str, text: str) -> None:
    if is_url(local_path(location)):
        from harmony_service_lib.s3_stac_io import S3StacIO

        S3StacIO().write_text(location, text)
    else:
        Path(local_path(location)).write_text(text)


def stage_locally() -> None:
    """Lets harmony-service-lib's ``stage`` (an adapter's upload of an output file) write to
    a local directory or ``file://`` URL, so that a service runs without cloud storage when its
    message's ``stagingLocation`` is one. Anything else goes to S3 as in Harmony."""
    from harmony_service_lib import aws

    upload = aws.stage

    def stage(
        config: Any,
        local_filename: str,
        remote_filename: str,
        mime: str,
        logger: Any,
        location: str | None = None,
    ) -> str:
        if location is None or is_url(local_path(location)):
            return str(upload(config, local_filename, remote_filename, mime, logger, location))
        directory = Path(local_path(location)).resolve()
        directory.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(local_filename, directory / remote_filename)
        return (directory / remote_filename).as_uri()

    # harmony_service_lib.util.stage, which adapters import, calls this one by its module.
    aws.stage = stage


def watch_http_downloads() -> None:
    """Says once, in the service's log, what an ``http(s)`` download needs that this runner
    cannot give it: the message's ``accessToken`` (harmony-service-lib 3.0 downloads over http
    only with one, and fails obscurely without), decrypted with ``SHARED_SECRET_KEY`` (unset,
    it is harmony-service-lib's default key, which only a message encrypted with that same
    default can use). harmony-service-lib's own warning, at every configuration it builds, is
    dropped (:class:`~fairway_client.harmony.QuietConfig`)."""
    from harmony_service_lib import http
    from harmony_service_lib.logging import build_logger
    from harmony_service_lib.util import DEFAULT_SHARED_SECRET_KEY

    download = http.download
    warned = False

    def checked(config: Any, url: str, access_token: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal warned
        if not warned:
            warned = True
            if access_token is None:
                build_logger(config).warning(
                    f"downloading {url} needs the message's accessToken, the user's Earthdata "
                    "Login token encrypted with SHARED_SECRET_KEY, as Harmony sends it: this "
                    "message has none"
                )
            elif config.shared_secret_key == DEFAULT_SHARED_SECRET_KEY:
                build_logger(config).warning(
                    "SHARED_SECRET_KEY is not set: the message's accessToken was decrypted "
                    "with harmony-service-lib's default (insecure) key; set it to the key "
                    "Harmony encrypts accessToken with"
                )
        return download(config, url, access_token, *args, **kwargs)

    # harmony_service_lib.util.download calls this one by its module.
    http.download = checked


def invoke(task: dict[str, Any]) -> list[str]:
    import harmony_service_lib

    workdir = Path(task["workdir"])
    adapter_class = load_adapter(task["adapter"])
    payload = task["payload"]
    if payload is None:
        try:
            payload = json.loads(read_text(task["payload_from"]))
        except FileNotFoundError:
            raise BadPayload(
                f"no payload and no {PAYLOAD_FILE} beside the first input "
                f"({task['payload_from']}): was the step before run by fairway-harmony?"
            ) from None
    step = int(task.get("step") or 0)
    try:
        step_operations(payload.get("steps"), step)
    except ValueError as error:
        raise BadPayload(str(error)) from None
    message = service_message(payload, step, task["item"], task["attempt"])
    message_file = workdir / "message.json"
    message_file.write_text(json.dumps(message))
    outputs: str = task["outputs"]
    # harmony-service-lib writes an s3 metadata directory's files under it as a prefix.
    metadata_dir = outputs.rstrip("/") + "/" if is_url(local_path(outputs)) else local_path(outputs)
    argv = [
        "--harmony-action",
        "invoke",
        "--harmony-input-file",
        str(message_file),
        "--harmony-sources",
        sources_catalog(list(task["inputs"]), workdir),
        "--harmony-metadata-dir",
        metadata_dir,
    ]
    if task.get("data_location"):
        argv += ["--harmony-data-location", task["data_location"]]
    stage_locally()
    watch_http_downloads()
    parser = argparse.ArgumentParser(prog=task["adapter"])
    harmony_service_lib.setup_cli(parser)
    args = parser.parse_args(argv)
    harmony_service_lib.run_cli(parser, args, adapter_class)
    # The whole payload, every step's operations and the request's own stagingLocation, for
    # the aggregating step after this one.
    write_text(join_location(outputs, PAYLOAD_FILE), json.dumps(payload))
    return output_catalogs(outputs, metadata_dir)


def harmony_outcome(error: Exception) -> dict[str, Any]:
    """What a ``HarmonyException`` makes of the item, as Harmony decides from its level and
    category: a warning ends it successful with no output; category ``noretry`` fails it for
    good; any other category fails the attempt, and the job's retry policy applies."""
    message = str(getattr(error, "message", None) or error)
    level = str(getattr(error, "level", None) or "").lower()
    category = str(getattr(error, "category", None) or "").lower()
    if level == "warning":
        return {"catalogs": [], "warning": message}
    return {"error": message, "retryable": category != "noretry"}


def main(task_file: str) -> int:
    # harmony-service-lib logs its configuration, with a warning about SHARED_SECRET_KEY, each
    # time it builds it (twice per invocation); watch_http_downloads warns when it matters.
    logging.getLogger().addFilter(QuietConfig())
    task = json.loads(Path(task_file).read_text())
    outcome_file = Path(task["workdir"]) / "outcome.json"
    from harmony_service_lib.exceptions import HarmonyException

    outcome: dict[str, Any]
    try:
        outcome = {"catalogs": invoke(task)}
    except BadPayload as error:
        outcome = {"error": str(error), "retryable": False}
    except HarmonyException as error:
        outcome = harmony_outcome(error)
    except SystemExit as error:
        outcome = {
            "error": f"harmony-service-lib refused the invocation (exit {error.code})",
            "retryable": False,
        }
    except Exception as error:
        traceback.print_exc()
        outcome = {"error": f"{type(error).__name__}: {error}", "retryable": True}
    outcome_file.write_text(json.dumps(outcome))
    return 0 if "catalogs" in outcome else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
