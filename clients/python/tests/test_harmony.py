"""``fairway-harmony`` running the sample Harmony service (tests/sample_harmony) unchanged: a
rewriting step over a three-item local STAC catalog, then an aggregating step."""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import Broker, missing_tool, unique
from fairway_client import Client, PermanentError
from fairway_client.harmony import HarmonyHandler, local_path

TESTS = Path(__file__).resolve().parent
ADAPTERS = "sample_harmony.adapters"


@pytest.fixture(scope="module")
def harmony() -> None:
    try:
        import harmony_service_lib  # noqa: F401
        import pystac  # noqa: F401
    except ImportError as error:
        missing_tool(f'harmony-service-lib is not installed ({error}): pip install ".[harmony]"')


def runner_command() -> list[str]:
    script = Path(sys.executable).with_name("fairway-harmony")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "fairway_client.harmony"]


def harmony_env(broker: Broker) -> dict[str, str]:
    env = dict(os.environ, FAIRWAY_URL=broker.url, STAGING_BUCKET="local", STAGING_PATH="tests")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    return env


def granule_catalogs(root: Path, texts: dict[str, str]) -> tuple[Path, list[Path]]:
    """A local STAC catalog of one item per granule, each under a catalog of its own (as
    Harmony hands a service one granule per work item); returns the root catalog and each
    granule's catalog."""
    import pystac

    data = root / "data"
    data.mkdir(parents=True)
    catalog = pystac.Catalog(id="granules", description="three text granules")
    for granule, text in texts.items():
        (data / f"{granule}.txt").write_text(text)
        item = pystac.Item(
            id=granule,
            geometry={"type": "Point", "coordinates": [0.0, 0.0]},
            bbox=[0.0, 0.0, 0.0, 0.0],
            datetime=datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc),
            properties={},
        )
        item.add_asset(
            "data",
            pystac.Asset(
                (data / f"{granule}.txt").as_uri(), media_type="text/plain", roles=["data"]
            ),
        )
        child = pystac.Catalog(id=f"granule-{granule}", description=f"granule {granule}")
        child.add_item(item)
        catalog.add_child(child)
    catalog.normalize_and_save(str(root / "catalog"), pystac.CatalogType.SELF_CONTAINED)
    children = [root / "catalog" / f"granule-{granule}" / "catalog.json" for granule in texts]
    return root / "catalog" / "catalog.json", children


def message(staging: Path) -> dict[str, Any]:
    return {
        "version": "0.19.0",
        "callback": "",
        "stagingLocation": staging.as_uri() + "/",
        "user": "alice",
        "client": "fairway-tests",
        "requestId": str(uuid.uuid4()),
        "isSynchronous": False,
        "sources": [{"collection": "C1-FAIRWAY", "shortName": "text", "variables": []}],
        "format": {"mime": "text/plain"},
    }


def catalog_texts(location: str) -> list[tuple[str, str]]:
    """Each item of the catalog at ``location``: its id and its data asset's text."""
    import pystac
    from pystac.stac_io import DefaultStacIO

    # Read as a plain pystac user would: harmony-service-lib's S3 reader needs its settings.
    catalog = pystac.Catalog.from_file(local_path(location), stac_io=DefaultStacIO())
    found = []
    for item in catalog.get_items(recursive=True):
        href = item.assets["data"].get_absolute_href() or item.assets["data"].href
        found.append((item.id, Path(local_path(href)).read_text()))
    return found


@pytest.fixture
def runners(
    harmony: None, broker: Broker, tmp_path: Path
) -> Iterator[tuple[str, str, list[subprocess.Popen[bytes]]]]:
    upper, concat = unique("uppercase"), unique("concatenate")
    started: list[subprocess.Popen[bytes]] = []
    # Artifacts as a path and as a file:// URL; one runner passes a claim strategy through.
    for service, adapter, artifacts, options in [
        (upper, "UppercaseAdapter", str(tmp_path / "artifacts"), []),
        (concat, "ConcatenateAdapter", (tmp_path / "artifacts").as_uri(), ["--strategy", "oldest"]),
    ]:
        started.append(
            subprocess.Popen(
                [
                    *runner_command(),
                    "--service",
                    service,
                    "--adapter",
                    f"{ADAPTERS}:{adapter}",
                    "--concurrency",
                    "2",
                    "--wait",
                    "5",
                    "--artifacts",
                    artifacts,
                    *options,
                ],
                cwd=TESTS,
                env=harmony_env(broker),
            )
        )
    yield upper, concat, started
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in started:
        assert process.wait(timeout=30) == 0


def test_harmony_adapters_run_unchanged_in_two_steps(
    broker: Broker, runners: tuple[str, str, list[subprocess.Popen[bytes]]], tmp_path: Path
) -> None:
    upper, concat, _ = runners
    texts = {"G1": "hello g1", "G2": "hello g2", "G3": "hello g3"}
    root, children = granule_catalogs(tmp_path / "input", texts)
    staging = tmp_path / "staging"
    steps: list[Any] = [upper, {"service": concat, "aggregate": True}]
    with Client(broker.url) as client:
        # One work item per granule (one as a file:// URL, the others as paths), aggregated.
        catalogs = [children[0].as_uri(), str(children[1]), str(children[2])]
        per_granule = client.submit(
            unique("alice"),
            steps,
            [{"message": message(staging / "a"), "catalog": catalog} for catalog in catalogs],
        )
        # One work item over the whole three-item catalog, then the same aggregation.
        whole = client.submit(
            unique("bob"), steps, [{"message": message(staging / "b"), "catalog": str(root)}]
        )
        # A granule the service refuses: its HarmonyException fails the item for good.
        bad_root, _ = granule_catalogs(tmp_path / "bad", {"G9": "FAIL here"})
        refused = client.submit(
            unique("carol"), steps, [{"message": message(staging / "c"), "catalog": str(bad_root)}]
        )

        assert client.wait(per_granule, timeout=90)["status"] == "successful"
        first_step = list(client.items(per_granule, step=0))
        for item, granule in zip(first_step, texts):
            (catalog,) = item["results"]
            assert catalog.endswith("/outputs/catalog.json")
            assert [text for _, text in catalog_texts(catalog)] == [texts[granule].upper()]
        (aggregate,) = client.items(per_granule, step=1)
        assert aggregate["inputs"] == [item["results"][0] for item in first_step]
        (merged,) = client.results(per_granule)
        assert merged.startswith("file://")
        assert catalog_texts(merged) == [("concatenated-3", "HELLO G1\nHELLO G2\nHELLO G3")]
        # The adapters' `stage` calls wrote to the message's file:// stagingLocation.
        assert sorted(path.name for path in (staging / "a").iterdir()) == [
            "G1_subsetted.txt",
            "G2_subsetted.txt",
            "G3_subsetted.txt",
            "concatenated-3.txt",
        ]

        assert client.wait(whole, timeout=90)["status"] == "successful"
        (rewritten,) = next(client.items(whole, step=0))["results"]
        assert sorted(text for _, text in catalog_texts(rewritten)) == [
            "HELLO G1",
            "HELLO G2",
            "HELLO G3",
        ]
        (merged,) = client.results(whole)
        assert catalog_texts(merged) == [("concatenated-3", "HELLO G1\nHELLO G2\nHELLO G3")]

        assert client.wait(refused, timeout=90)["status"] == "failed"
        (failed,) = client.items(refused)
        assert failed["attempt"] == 1
        assert failed["error"] == "granule G9 cannot be rewritten"


def test_payload_without_a_message_fails_for_good(tmp_path: Path) -> None:
    handler = HarmonyHandler(f"{ADAPTERS}:UppercaseAdapter", str(tmp_path))
    item = {"id": 1, "job_id": "j", "attempt": 1, "inputs": []}
    with pytest.raises(PermanentError):
        handler.task({**item, "payload": {"catalog": "x"}}, tmp_path)
    with pytest.raises(PermanentError):
        handler.task({**item, "payload": {"message": {}}}, tmp_path)
    task = handler.task({**item, "payload": {"message": "{}", "catalog": "c.json"}}, tmp_path)
    assert task["inputs"] == ["c.json"]
    assert task["outputs"] == str(tmp_path / "j" / "1" / "1" / "outputs")
    s3 = HarmonyHandler("m:C", "s3://bucket/artifacts/")
    chained = s3.task({**item, "inputs": ["s3://b/c.json"], "payload": {"message": {}}}, tmp_path)
    assert chained["outputs"] == "s3://bucket/artifacts/j/1/1/outputs"
    assert chained["inputs"] == ["s3://b/c.json"]


def test_runner_refuses_to_start_without_harmony_configuration(
    harmony: None, broker: Broker
) -> None:
    env = harmony_env(broker)
    env.pop("STAGING_BUCKET")
    env.pop("STAGING_PATH")
    done = subprocess.run(
        [*runner_command(), "--service", "s", "--adapter", f"{ADAPTERS}:UppercaseAdapter"],
        cwd=TESTS,
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert b"STAGING_PATH" in done.stderr


def test_runner_names_a_missing_adapter(harmony: None, broker: Broker) -> None:
    done = subprocess.run(
        [*runner_command(), "--service", "s", "--adapter", "no_such_module:Adapter"],
        cwd=TESTS,
        env=harmony_env(broker),
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert b"no_such_module" in done.stderr
