"""``fairway-harmony`` running the sample Harmony service (tests/sample_harmony) unchanged: a
rewriting step over a three-item local STAC catalog, then an aggregating step."""

from __future__ import annotations

import base64
import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import pytest

from conftest import Broker, missing_tool, unique, wait_until
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
    # As the tests expect them: the service named by the runner, harmony-service-lib's key.
    env.pop("APP_NAME", None)
    env.pop("SHARED_SECRET_KEY", None)
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
        # A granule the service refuses: its NoRetryException fails the item for good.
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
        # The adapters' `stage` calls wrote to the message's file:// stagingLocation, under
        # each item's id and attempt.
        assert sorted(
            str(path.relative_to(staging / "a")) for path in (staging / "a").rglob("*.txt")
        ) == sorted(
            [f"{item['id']}/1/{granule}_subsetted.txt" for item, granule in zip(first_step, texts)]
            + [f"{aggregate['id']}/1/concatenated-3.txt"]
        )

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


# Harmony services as Harmony runs them: staging, retries, per-step operations, cancels, logs.
# The service is ExampleAdapter (tests/sample_harmony), which works as
# nasa/harmony-service-example does: fixed output names, staged to the message's
# stagingLocation; its message's extraArgs make it misbehave.

#: harmony-service-lib's key when SHARED_SECRET_KEY is not set, as the tests run it.
DEFAULT_SHARED_SECRET_KEY = b"_THIS_IS_MY_32_CHARS_SECRET_KEY_"

Runner = Callable[..., "subprocess.Popen[bytes]"]


@pytest.fixture
def start_runner(harmony: None, broker: Broker, tmp_path: Path) -> Iterator[Runner]:
    """Starts fairway-harmony runners of ``adapter`` (a class of sample_harmony.adapters) for
    ``service``, their output in ``log`` when given; stops them when the test ends."""
    started: list[tuple[subprocess.Popen[bytes], Any]] = []

    def start(service: str, adapter: str, *options: str, log: Path | None = None) -> Any:
        output = log.open("wb") if log is not None else None
        process = subprocess.Popen(
            [
                *runner_command(),
                "--service",
                service,
                "--adapter",
                f"{ADAPTERS}:{adapter}",
                "--wait",
                "5",
                "--artifacts",
                str(tmp_path / "artifacts"),
                *options,
            ],
            cwd=TESTS,
            env=harmony_env(broker),
            stdout=output,
            stderr=subprocess.STDOUT if output is not None else None,
        )
        started.append((process, output))
        return process

    yield start
    for process, _ in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    codes = []
    for process, output in started:
        try:
            codes.append(process.wait(timeout=30))
        except subprocess.TimeoutExpired:
            process.kill()
            codes.append(process.wait())
        if output is not None:
            output.close()
    assert codes == [0] * len(started)


def example_message(staging: Path, **extra_args: Any) -> dict[str, Any]:
    """A Harmony message asking for a spatial subset in text/plain, staged under ``staging``."""
    harmony_message = message(staging)
    harmony_message["subset"] = {"bbox": [-10.0, -10.0, 10.0, 10.0]}
    if extra_args:
        harmony_message["extraArgs"] = extra_args
    return harmony_message


def catalog_assets(location: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Each item of the catalog at ``location``: its data asset's local path, that file's text,
    and the item's properties."""
    import pystac
    from pystac.stac_io import DefaultStacIO

    catalog = pystac.Catalog.from_file(local_path(location), stac_io=DefaultStacIO())
    found = []
    for item in catalog.get_items(recursive=True):
        href = item.assets["data"].get_absolute_href() or item.assets["data"].href
        path = local_path(href)
        found.append((path, Path(path).read_text(), dict(item.properties)))
    return found


def single_result(client: Any, job_id: str, step: int) -> list[dict[str, Any]]:
    return list(client.items(job_id, step=step))


def encrypted_token(token: str) -> str:
    """``token`` encrypted as Harmony encrypts a message's accessToken, with the key
    harmony-service-lib uses when SHARED_SECRET_KEY is unset."""
    from nacl.secret import SecretBox
    from nacl.utils import random

    nonce = random(SecretBox.NONCE_SIZE)
    sealed = SecretBox(DEFAULT_SHARED_SECRET_KEY).encrypt(token.encode(), nonce)
    return f"{base64.b64encode(nonce).decode()}:{base64.b64encode(sealed.ciphertext).decode()}"


class GranuleServer:
    """Serves granules over http: ``/NAME.txt`` answers ``hello NAME``, after answering 503 as
    many times as ``unavailable[NAME]`` says; records each request's path and Authorization."""

    def __init__(self) -> None:
        self.unavailable: dict[str, int] = {}
        self.requests: list[tuple[str, str | None]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                name = self.path.split("?")[0].strip("/").removesuffix(".txt")
                outer.requests.append((name, self.headers.get("Authorization")))
                if outer.unavailable.get(name, 0) > 0:
                    outer.unavailable[name] -= 1
                    self.send_response(503)
                    self.end_headers()
                    self.wfile.write(b"unavailable")
                    return
                body = f"hello {name.lower()}".encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def granule_server() -> Iterator[GranuleServer]:
    server = GranuleServer()
    yield server
    server.close()


def http_granule_catalog(root: Path, granule: str, url: str) -> str:
    """A catalog of one item whose data asset is ``url``."""
    import pystac

    item = pystac.Item(
        id=granule,
        geometry={"type": "Point", "coordinates": [0.0, 0.0]},
        bbox=[0.0, 0.0, 0.0, 0.0],
        datetime=datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc),
        properties={},
    )
    item.add_asset("data", pystac.Asset(url, media_type="text/plain", roles=["data"]))
    catalog = pystac.Catalog(id=f"granule-{granule}", description=f"granule {granule}")
    catalog.add_item(item)
    catalog.normalize_and_save(str(root / granule), pystac.CatalogType.SELF_CONTAINED)
    return str(root / granule / "catalog.json")


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (reaped, or a zombie its parent is about to reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def test_each_item_step_and_attempt_stages_under_its_own_path(
    start_runner: Runner, broker: Broker, tmp_path: Path
) -> None:
    """The service writes fixed names (G1_subsetted.txt at both of its steps): each step's
    output catalog still points at its own files once the job has ended."""
    first, second, concat = unique("example"), unique("example"), unique("concatenate")
    start_runner(first, "ExampleAdapter", "--concurrency", "2")
    start_runner(second, "ExampleAdapter", "--concurrency", "2")
    start_runner(concat, "ConcatenateAdapter")
    _, catalogs = granule_catalogs(tmp_path / "input", {"G1": "hello g1", "G2": "hello g2"})
    staging = tmp_path / "staging"
    with Client(broker.url) as client:
        job_id = client.submit(
            unique("alice"),
            [first, second, {"service": concat, "aggregate": True}],
            [{"message": example_message(staging), "catalog": str(each)} for each in catalogs],
        )
        assert client.wait(job_id, timeout=120)["status"] == "successful"
        steps = [single_result(client, job_id, step) for step in range(3)]

    def staged(item: dict[str, Any]) -> tuple[str, str]:
        (catalog,) = item["results"]
        ((path, text, _),) = catalog_assets(catalog)
        # Under the request's stagingLocation, the item's id and its attempt.
        assert Path(path).parent == staging / str(item["id"]) / str(item["attempt"])
        return path, text

    outputs = {}
    for granule, item in zip(["G1", "G2"], steps[0]):
        outputs[(0, granule)] = staged(item)
        assert outputs[(0, granule)][1] == f"hello {granule.lower()}\nreformat spatialSubset"
    second_texts = []  # in item order, which is the aggregate's
    for item in steps[1]:
        granule = "G1" if item["inputs"] == steps[0][0]["results"] else "G2"
        outputs[(1, granule)] = staged(item)
        second_texts.append(outputs[(1, granule)][1])
        assert outputs[(1, granule)][1] == (
            f"hello {granule.lower()}\nreformat spatialSubset\nreformat spatialSubset"
        )
    (aggregate,) = steps[2]
    outputs[(2, "all")] = staged(aggregate)
    assert outputs[(2, "all")][1] == "\n".join(second_texts)
    # The same name at both steps, yet every file is its own, and still there.
    assert Path(outputs[(0, "G1")][0]).name == Path(outputs[(1, "G1")][0]).name
    assert len({path for path, _ in outputs.values()}) == len(outputs)


def test_harmony_exceptions_end_items_as_harmony_ends_them(
    start_runner: Runner, broker: Broker, tmp_path: Path, granule_server: GranuleServer
) -> None:
    service = unique("example")
    start_runner(service, "ExampleAdapter", "--concurrency", "4")
    _, catalogs = granule_catalogs(
        tmp_path / "input", {name: f"hello {name.lower()}" for name in ["G1", "G2", "G3", "G4"]}
    )
    state = tmp_path / "state"
    state.mkdir()
    staging = tmp_path / "staging"
    # G5's data comes over http: its first download answers 503.
    granule_server.unavailable["G5"] = 1
    g5 = http_granule_catalog(tmp_path / "http", "G5", f"{granule_server.url}/G5.txt")
    with_token = example_message(staging)
    with_token["accessToken"] = encrypted_token("edl-token-of-alice")
    misbehaving: list[dict[str, Any]] = [
        {"raise": "NoRetryException", "raise_message": "granule G1 is malformed"},
        {"raise": "ServerException", "raise_message": "the archive answered 500"},
        {"raise": "RuntimeError", "raise_message": "out of scratch", "raise_times": 1},
        {"raise": "HarmonyException", "raise_message": "bad bbox", "raise_category": "noretry"},
    ]
    items = [
        {"message": example_message(staging, state=str(state), **extra), "catalog": str(catalog)}
        for extra, catalog in zip(misbehaving, catalogs)
    ]
    items.append({"message": with_token, "catalog": g5})
    with Client(broker.url) as client:
        job_id = client.submit(
            unique("alice"), [service], items, retry={"max_attempts": 3, "backoff": "none"}
        )
        assert client.wait(job_id, timeout=120)["status"] == "complete_with_errors"
        g1, g2, g3, g4, g5_item = client.items(job_id)

    # category NoRetry, in any case: failed for good, at the first attempt.
    assert (g1["status"], g1["attempt"], g1["error"]) == ("failed", 1, "granule G1 is malformed")
    assert (g4["status"], g4["attempt"], g4["error"]) == ("failed", 1, "bad bbox")
    # ServerException: retried by the job's policy, every attempt spent.
    assert (g2["status"], g2["attempt"]) == ("failed", 3)
    assert g2["error"] == "the archive answered 500"
    # Any other exception: retried, and the next attempt succeeds.
    assert (g3["status"], g3["attempt"]) == ("successful", 2)
    # A 503 on a download (a ServerException from harmony-service-lib): retried too.
    assert (g5_item["status"], g5_item["attempt"]) == ("successful", 2)
    ((_, text, _),) = catalog_assets(g5_item["results"][0])
    assert text == "hello g5\nreformat spatialSubset"
    # Downloaded with the message's accessToken, decrypted with SHARED_SECRET_KEY: a 503,
    # then the granule.
    assert granule_server.unavailable["G5"] == 0
    assert granule_server.requests == [("G5", "Bearer edl-token-of-alice")] * 2


def test_no_data_ends_the_item_successful_with_its_warning(
    start_runner: Runner, broker: Broker, tmp_path: Path
) -> None:
    service, concat = unique("example"), unique("concatenate")
    start_runner(service, "ExampleAdapter", "--concurrency", "2")
    start_runner(concat, "ConcatenateAdapter")
    _, catalogs = granule_catalogs(tmp_path / "input", {"G1": "hello g1", "G2": "hello g2"})
    staging = tmp_path / "staging"
    empty = example_message(
        staging, **{"raise": "NoDataException", "raise_message": "no data in G1's bbox"}
    )
    with Client(broker.url) as client:
        job_id = client.submit(
            unique("alice"),
            [service, {"service": concat, "aggregate": True}],
            [
                {"message": empty, "catalog": str(catalogs[0])},
                {"message": example_message(staging), "catalog": str(catalogs[1])},
            ],
            retry={"max_attempts": 3, "backoff": "none"},
        )
        assert client.wait(job_id, timeout=120)["status"] == "successful"
        g1, g2 = single_result(client, job_id, 0)
        (aggregate,) = single_result(client, job_id, 1)
    assert (g1["status"], g1["attempt"], g1["results"]) == ("successful", 1, [])
    assert g1["warning"] == "no data in G1's bbox"
    assert g2["status"] == "successful"
    assert g2.get("warning") is None
    # The step after gets nothing from the item without data.
    assert aggregate["inputs"] == g2["results"]
    ((_, text, _),) = catalog_assets(aggregate["results"][0])
    assert text == "hello g2\nreformat spatialSubset"

    # No item has data: nothing to aggregate, and the job succeeds all the same.
    with Client(broker.url) as client:
        job_id = client.submit(
            unique("alice"),
            [service, {"service": concat, "aggregate": True}],
            [{"message": empty, "catalog": str(catalogs[0])}],
        )
        assert client.wait(job_id, timeout=120)["status"] == "successful"
        (aggregate,) = single_result(client, job_id, 1)
    assert (aggregate["inputs"], aggregate["results"]) == ([], [])
    assert aggregate["warning"].startswith("nothing to aggregate")


def test_each_step_is_handed_only_its_own_operations(
    start_runner: Runner, broker: Broker, tmp_path: Path
) -> None:
    subsetter, reprojector, reformatter = (unique(name) for name in ["subset", "reproj", "fmt"])
    start_runner(subsetter, "ExampleAdapter")
    start_runner(reprojector, "ExampleAdapter")
    start_runner(reformatter, "ExampleAdapter")
    _, catalogs = granule_catalogs(tmp_path / "input", {"G1": "hello g1", "G2": "hello g2"})
    harmony_message = example_message(tmp_path / "staging")
    harmony_message["format"]["crs"] = "EPSG:4326"
    harmony_message["temporal"] = {"start": "2024-01-01T00:00:00Z", "end": "2024-01-02T00:00:00Z"}
    steps = [
        {"operations": ["spatialSubset", "temporalSubset"]},
        {"operations": ["reproject"]},
        {"operations": ["reformat"]},
    ]
    with Client(broker.url) as client:
        job_id = client.submit(
            unique("alice"),
            [subsetter, reprojector, {"service": reformatter, "aggregate": True}],
            [
                {"message": harmony_message, "catalog": str(catalog), "steps": steps}
                for catalog in catalogs
            ],
        )
        assert client.wait(job_id, timeout=120)["status"] == "successful"
        seen = [
            [
                properties["operations"]
                for item in client.items(job_id, step=step)
                for _, _, properties in catalog_assets(item["results"][0])
            ]
            for step in range(3)
        ]
    assert seen == [
        [["spatialSubset", "temporalSubset"]] * 2,
        [["reproject"]] * 2,
        # The aggregating step's one item, over both granules.
        [["reformat"]] * 2,
    ]


def test_a_canceled_jobs_service_is_killed_and_the_worker_moves_on(
    start_runner: Runner, broker: Broker, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    service = unique("example")
    start_runner(service, "ExampleAdapter", "--heartbeat", "1")
    _, catalogs = granule_catalogs(tmp_path / "input", {"G1": "hello g1", "G2": "hello g2"})
    staging, pid_file = tmp_path / "staging", tmp_path / "service.pid"
    slow = example_message(staging, sleep=600, pid_file=str(pid_file))
    with Client(broker.url) as client:
        doomed = client.submit(
            unique("ivy"), [service], [{"message": slow, "catalog": str(catalogs[0])}]
        )
        wait_until(lambda: pid_file.exists() and bool(pid_file.read_text()), 60, "the service")
        pid = int(pid_file.read_text())

        def kill_left_over() -> None:
            if not process_gone(pid):
                os.kill(pid, signal.SIGKILL)

        request.addfinalizer(kill_left_over)
        assert not process_gone(pid)
        # The runner works one item at a time: this one waits for the slow one.
        waiting = client.submit(
            unique("jack"),
            [service],
            [{"message": example_message(staging), "catalog": str(catalogs[1])}],
        )
        time.sleep(1.5)
        assert [item["status"] for item in client.items(waiting)] == ["ready"]

        canceled_at = time.monotonic()
        client.cancel(doomed)
        wait_until(lambda: process_gone(pid), 5, "the canceled item's service to be killed")
        wait_until(
            lambda: next(client.items(waiting))["status"] != "ready",
            max(0.0, 5 - (time.monotonic() - canceled_at)),
            "the worker to take the next item",
        )
        assert time.monotonic() - canceled_at < 5
        assert client.wait(waiting, timeout=60)["status"] == "successful"
        assert [item["status"] for item in client.items(doomed)] == ["canceled"]


def test_the_service_logs_as_itself_and_warns_of_its_key_only_when_it_matters(
    start_runner: Runner, broker: Broker, tmp_path: Path, granule_server: GranuleServer
) -> None:
    local, remote = unique("example"), unique("example")
    local_log, remote_log = tmp_path / "local.log", tmp_path / "remote.log"
    start_runner(local, "ExampleAdapter", log=local_log)
    start_runner(remote, "ExampleAdapter", log=remote_log)
    _, catalogs = granule_catalogs(tmp_path / "input", {"G1": "hello g1", "G2": "hello g2"})
    staging = tmp_path / "staging"
    with_token = example_message(staging)
    with_token["accessToken"] = encrypted_token("edl-token-of-bob")
    g3 = http_granule_catalog(tmp_path / "http", "G3", f"{granule_server.url}/G3.txt")
    with Client(broker.url) as client:
        local_job = client.submit(
            unique("bob"),
            [local],
            [{"message": example_message(staging), "catalog": str(each)} for each in catalogs],
        )
        remote_job = client.submit(
            unique("bob"), [remote], [{"message": with_token, "catalog": g3}]
        )
        assert client.wait(local_job, timeout=90)["status"] == "successful"
        assert client.wait(remote_job, timeout=90)["status"] == "successful"

    for service, log in [(local, local_log), (remote, remote_log)]:
        text = log.read_text()
        entries = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
        assert entries, text
        assert {entry.get("application") for entry in entries} == {service}, text
        assert "_harmony_invoke" not in text
    # Two items with local files: no word of the key; one http download: one warning.
    assert "SHARED_SECRET_KEY" not in local_log.read_text()
    warned = [line for line in remote_log.read_text().splitlines() if "SHARED_SECRET_KEY" in line]
    assert len(warned) == 1, warned


def test_a_step_is_handed_its_operations_and_staged_under_its_item() -> None:
    from fairway_client.harmony import item_staging, service_message, step_message

    full = {
        "stagingLocation": "s3://staging/public/request-1/",
        "sources": [{"collection": "C1", "variables": [{"name": "red"}]}, {"collection": "C2"}],
        "format": {
            "mime": "image/png",
            "crs": "EPSG:4326",
            "srs": {"epsg": "EPSG:4326"},
            "interpolation": "near",
            "scaleExtent": {"x": {"min": 0, "max": 1}},
            "width": 100,
        },
        "subset": {"bbox": [0, 0, 1, 1], "shape": {"href": "s3://s.json"}, "dimensions": []},
        "temporal": {"start": "2024-01-01T00:00:00Z"},
        "extraArgs": {"cut": True},
    }
    original = json.loads(json.dumps(full))
    subset = step_message(full, ["spatialSubset", "variableSubset"])
    assert subset["format"] == {"width": 100}
    assert subset["subset"] == {"bbox": [0, 0, 1, 1]}
    assert "temporal" not in subset
    assert subset["sources"] == full["sources"]
    assert subset["extraArgs"] == {"cut": True}
    reformat = step_message(full, ["reformat"])
    assert reformat["format"] == {"mime": "image/png", "width": 100}
    assert reformat["sources"] == [{"collection": "C1"}, {"collection": "C2"}]
    assert step_message(full, []) == full
    assert step_message(full, None) == full
    assert full == original

    assert item_staging("s3://staging/public/request-1/", 12, 3) == (
        "s3://staging/public/request-1/12/3/"
    )
    assert item_staging("s3://staging/public/request-1", 12, 3) == (
        "s3://staging/public/request-1/12/3/"
    )
    assert item_staging("/data/staging", 12, 3) == "/data/staging/12/3/"
    steps = [{"operations": ["reproject"]}, {"operations": ["reformat"]}]
    handed = service_message({"message": full, "steps": steps}, 1, 7, 2)
    assert handed["stagingLocation"] == "s3://staging/public/request-1/7/2/"
    assert handed["format"] == {"mime": "image/png", "width": 100}
    # A step the payload gives no operations gets the whole message.
    assert service_message({"message": full, "steps": steps}, 2, 7, 2)["subset"] == full["subset"]


def test_a_payload_with_malformed_steps_fails_for_good(tmp_path: Path) -> None:
    handler = HarmonyHandler(f"{ADAPTERS}:ExampleAdapter", str(tmp_path), data_location="/out")
    item = {"id": 5, "job_id": "j", "attempt": 2, "step": 1, "inputs": ["in/catalog.json"]}
    for steps in [{"operations": []}, [None, "reproject"], [None, {"operations": "reproject"}]]:
        with pytest.raises(PermanentError):
            handler.task({**item, "payload": {"message": {}, "steps": steps}}, tmp_path)
    task = handler.task(
        {**item, "payload": {"message": {}, "steps": [None, {"operations": ["reproject"]}]}},
        tmp_path,
    )
    assert task["data_location"] == "/out/5/2/"
    assert task["step"] == 1
