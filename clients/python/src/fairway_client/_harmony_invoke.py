"""One Harmony invocation, in a process of its own, as Harmony runs a service per work item:
``python -m fairway_client._harmony_invoke TASK``, where TASK is the JSON file
:class:`fairway_client.harmony.HarmonyHandler` wrote. It builds the input catalog, calls
harmony-service-lib's command line (``setup_cli`` and ``run_cli``) with the arguments Harmony
passes, and writes ``outcome.json`` beside TASK: the output catalogs, or the error and whether
another attempt may help."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import traceback
from pathlib import Path
from typing import Any

from .harmony import MESSAGE_FILE, is_url, join_location, load_adapter, local_path


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


class NoMessage(Exception):
    """An aggregating item's inputs carry no message beside them."""


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


def invoke(task: dict[str, Any]) -> list[str]:
    import harmony_service_lib

    workdir = Path(task["workdir"])
    adapter_class = load_adapter(task["adapter"])
    message = task["message"]
    if message is None:
        try:
            message = json.loads(read_text(task["message_from"]))
        except FileNotFoundError:
            raise NoMessage(
                f"no payload and no {MESSAGE_FILE} beside the first input "
                f"({task['message_from']}): was the step before run by fairway-harmony?"
            ) from None
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
    parser = argparse.ArgumentParser(prog=task["adapter"])
    harmony_service_lib.setup_cli(parser)
    args = parser.parse_args(argv)
    harmony_service_lib.run_cli(parser, args, adapter_class)
    write_text(join_location(outputs, MESSAGE_FILE), json.dumps(message))
    return output_catalogs(outputs, metadata_dir)


def main(task_file: str) -> int:
    task = json.loads(Path(task_file).read_text())
    outcome_file = Path(task["workdir"]) / "outcome.json"
    from harmony_service_lib.exceptions import HarmonyException

    outcome: dict[str, Any]
    try:
        outcome = {"catalogs": invoke(task)}
    except NoMessage as error:
        outcome = {"error": str(error), "retryable": False}
    except HarmonyException as error:
        # The service's own verdict on the request: another attempt would say the same.
        outcome = {"error": str(error.message or error), "retryable": False}
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
