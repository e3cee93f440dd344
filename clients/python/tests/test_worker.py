"""The worker side: long polls, heartbeats, reports and their resends, failures, stopping, and
brokers away (a report kept until one takes it, several brokers, a true last line)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

from conftest import Broker, StandIn, TlsBroker, answer, forward, unique, wait_until
from fairway_client import Client, FairwayError, PermanentError, Release, Worker, default_querier
from fairway_client.worker import Handler, _Held, heartbeat_period, parse_timestamp

WORKER_PROCESS = Path(__file__).with_name("worker_process.py")


class Running:
    """Workers run in threads for a test, each stopped and joined at its end."""

    def __init__(self) -> None:
        self.threads: list[tuple[Worker, threading.Thread]] = []
        self.errors: list[BaseException] = []

    def start(self, worker: Worker) -> threading.Thread:
        def run() -> None:
            try:
                worker.run()
            except BaseException as error:
                self.errors.append(error)

        thread = threading.Thread(target=run, name=f"worker-{worker.service}", daemon=True)
        thread.start()
        self.threads.append((worker, thread))
        return thread

    def stop_all(self) -> None:
        for worker, _ in self.threads:
            worker.stop()
        for _, thread in self.threads:
            thread.join(timeout=30)
            assert not thread.is_alive(), "a worker did not stop"


@pytest.fixture
def running() -> Iterator[Running]:
    workers = Running()
    yield workers
    workers.stop_all()


def item_of(client: Client, job_id: str, predicate: Callable[[dict[str, Any]], bool]) -> Any:
    return next(item for item in client.items(job_id) if predicate(item))


def count(client: Client, job_id: str, status: str) -> int:
    return len(list(client.items(job_id, status=status)))


def querier_of(url: str, querier: str) -> dict[str, Any] | None:
    """The querier as ``GET /admin/queriers`` shows it, or None if the broker has none."""
    queriers = httpx.get(f"{url}/admin/queriers").json()["queriers"]
    return next((each for each in queriers if each["querier"] == querier), None)


def has_left(url: str, querier: str) -> bool:
    """Whether the querier no longer serves: not active, and in no shard (or forgotten)."""
    state = querier_of(url, querier)
    return state is None or (state["state"] != "active" and not state["in_shards"])


def test_two_step_workflow_with_an_aggregating_step(broker: Broker, running: Running) -> None:
    subsetter, concat = unique("subsetter"), unique("concat")

    def subset(item: dict[str, Any]) -> list[str]:
        return ["s3://out/" + item["payload"]["granule"] + ".nc"]

    def concatenate(item: dict[str, Any]) -> list[Any]:
        return ["s3://out/merged.nc", len(item["inputs"])]

    running.start(Worker(broker.url, service=subsetter, handler=subset, concurrency=3, wait=2))
    running.start(Worker(broker.url, service=concat, handler=concatenate, wait=2))
    granules = [{"granule": f"G{n}"} for n in range(12)]
    with Client(broker.url) as client:
        aggregated = client.submit(
            user=unique("alice"),
            steps=[subsetter, {"service": concat, "aggregate": True}],
            items=granules,
            is_async=False,
        )
        # A one-step job of the same service: its last step has one item per granule, so its
        # results come a page of five items at a time.
        single = client.submit(unique("bob"), [subsetter], granules)
        assert client.wait(aggregated, timeout=60)["status"] == "successful"
        assert client.wait(single, timeout=60)["status"] == "successful"

        # Two pages: the aggregating item's results fill the first, and the second says so.
        pages = list(client.results_pages(aggregated, page_size=1))
        assert [page["results"] for page in pages] == [["s3://out/merged.nc", 12], []]
        assert list(client.results(aggregated, page_size=1)) == ["s3://out/merged.nc", 12]
        items = list(client.items(aggregated, page_size=5))
        assert len(items) == 13
        aggregate = items[-1]
        assert aggregate["step"] == 1
        assert aggregate["inputs"] == [f"s3://out/G{n}.nc" for n in range(12)]

        pages = list(client.results_pages(single, page_size=5))
        assert [len(page["results"]) for page in pages] == [5, 5, 2]
        assert list(client.results(single, page_size=5)) == [f"s3://out/G{n}.nc" for n in range(12)]
    assert running.errors == []


def test_a_failed_attempt_is_retried_then_succeeds(broker: Broker, running: Running) -> None:
    service = unique("flaky")

    def flaky(item: dict[str, Any]) -> list[str]:
        if item["attempt"] == 1:
            raise RuntimeError("the archive timed out")
        return [f"done on attempt {item['attempt']}"]

    running.start(Worker(broker.url, service=service, handler=flaky, wait=2))
    with Client(broker.url) as client:
        job_id = client.submit(unique("carol"), [service], ["G1"])
        assert client.wait(job_id, timeout=30)["status"] == "successful"
        (item,) = client.items(job_id)
        assert item["attempt"] == 2
        assert item["results"] == ["done on attempt 2"]


def test_permanent_error_and_bad_results_fail_the_item_for_good(
    broker: Broker, running: Running
) -> None:
    service = unique("strict")

    def strict(item: dict[str, Any]) -> Any:
        if item["payload"] == "missing":
            raise PermanentError("granule missing not found")
        if item["payload"] == "nan":
            return [float("nan")]
        if item["payload"] == "huge":
            return ["x" * (9 << 20)]  # over the broker's --max-body-bytes (8 MiB)
        return "not a list"

    running.start(Worker(broker.url, service=service, handler=strict, wait=2))
    with Client(broker.url) as client:
        job_id = client.submit(unique("dave"), [service], ["missing", "odd", "nan", "huge"])
        assert client.wait(job_id, timeout=30)["status"] == "failed"
        items = {item["payload"]: item for item in client.items(job_id)}
        assert all(item["attempt"] == 1 for item in items.values())
        assert items["missing"]["error"] == "granule missing not found"
        assert "not a list" in items["odd"]["error"]
        assert "not JSON" in items["nan"]["error"]
        assert items["huge"]["error"].startswith("the broker refused the results")


class FirstCallReleases:
    """A handler that hands each item back the first time it sees it, with the reason its
    payload names, and succeeds the second time."""

    def __init__(self, reasons: dict[str, Any]) -> None:
        self.reasons = reasons
        self.seen: set[int] = set()
        self.lock = threading.Lock()

    def first_call(self, item: dict[str, Any]) -> bool:
        with self.lock:
            first = item["id"] not in self.seen
            self.seen.add(item["id"])
        return first

    def __call__(self, item: dict[str, Any]) -> list[Any]:
        if self.first_call(item):
            raise Release(*self.reasons.get(item["payload"], ()))
        return [f"{item['payload']} on attempt {item['attempt']}"]


@pytest.mark.parametrize("kind", ["thread", "coroutine"])
def test_a_released_item_goes_again_without_spending_its_attempt(
    broker: Broker, running: Running, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    service = unique("picky")
    caplog.set_level(logging.INFO, logger="fairway_client.worker")
    releases = FirstCallReleases({"G1": ("not now",)})

    async def on_the_loop(item: dict[str, Any]) -> list[Any]:
        return releases(item)

    handler: Handler = releases if kind == "thread" else on_the_loop
    running.start(Worker(broker.url, service=service, handler=handler, wait=2))
    with Client(broker.url) as client:
        # One attempt: had the release spent it, the item would have failed for good.
        job_id = client.submit(unique("olga"), [service], ["G1"], retry={"max_attempts": 1})
        assert client.wait(job_id, timeout=30)["status"] == "successful"
        (item,) = client.items(job_id)
        assert item["status"] == "successful"
        assert item["attempt"] == 2, "the release's attempt stays, so the next one is 2"
        assert item["releases"] == 1
        assert item["release_reason"] == "not now"
        assert item["results"] == ["G1 on attempt 2"]
        assert item["error"] is None
    handed_back = [
        record
        for record in caplog.records
        if record.name == "fairway_client.worker" and "handed back" in record.getMessage()
    ]
    assert [record.levelno for record in handed_back] == [logging.INFO]
    assert f"item {item['id']} handed back: not now" in handed_back[0].getMessage()


def test_a_release_without_a_reason_or_with_one_the_broker_refuses(
    broker: Broker, running: Running
) -> None:
    service = unique("reasons")
    releases = FirstCallReleases({"long": ("x" * 1500,), "nul": ("a\x00b",), "bare": ()})
    running.start(Worker(broker.url, service=service, handler=releases, wait=2))
    with Client(broker.url) as client:
        job_id = client.submit(
            unique("pia"), [service], ["long", "nul", "bare"], retry={"max_attempts": 1}
        )
        assert client.wait(job_id, timeout=30)["status"] == "successful"
        items = {item["payload"]: item for item in client.items(job_id)}
        assert {payload: item["releases"] for payload, item in items.items()} == {
            "long": 1,
            "nul": 1,
            "bare": 1,
        }
        # Cut to the broker's 1000 characters; a NUL it refuses: handed back without it.
        assert items["long"]["release_reason"] == "x" * 1000
        assert "release_reason" not in items["nul"]
        assert "release_reason" not in items["bare"]
        assert all(item["attempt"] == 2 for item in items.values())


def test_async_handler_and_strategy(broker: Broker, running: Running) -> None:
    service = unique("render")

    async def render(item: dict[str, Any]) -> list[Any]:
        await asyncio.sleep(0.01)
        return [item["payload"] * 2]

    preview = {"select_only": {"key": "mode", "value": "preview", "then": "oldest"}}
    running.start(
        Worker(broker.url, service=service, handler=render, wait=2, strategy=preview, concurrency=2)
    )
    with Client(broker.url) as client:
        full = client.submit(unique("erin"), [service], [1], metadata={"mode": "full"})
        quick = client.submit(unique("erin"), [service], [2, 3], metadata={"mode": "preview"})
        assert client.wait(quick, timeout=30)["status"] == "successful"
        assert list(client.results(quick)) == [4, 6]
        assert client.job(full)["status"] != "successful"
        assert count(client, full, "ready") == 1
        client.cancel(full)


def test_a_refused_strategy_ends_run_with_the_error(broker: Broker) -> None:
    worker = Worker(
        broker.url, service=unique("s"), handler=lambda item: [], strategy="no-such-strategy"
    )
    with pytest.raises(FairwayError) as refused:
        worker.run()
    assert refused.value.status == 400
    assert refused.value.code == "invalid_strategy"


def test_heartbeats_keep_the_lease_past_its_length(
    short_lease_broker: Broker, running: Running
) -> None:
    service = unique("slow")

    def slow(item: dict[str, Any]) -> list[str]:
        time.sleep(5)  # two and a half leases of 2 s
        return ["slow but steady"]

    running.start(Worker(short_lease_broker.url, service=service, handler=slow, wait=2))
    with Client(short_lease_broker.url) as client:
        job_id = client.submit(unique("frank"), [service], ["G1"])
        assert client.wait(job_id, timeout=30)["status"] == "successful"
        (item,) = client.items(job_id)
        assert item["attempt"] == 1, "the lease expired and the item was tried again"
        assert item["results"] == ["slow but steady"]


def test_a_canceled_item_is_given_up_and_its_coroutine_cancelled(
    short_lease_broker: Broker, running: Running
) -> None:
    service = unique("canceled")
    started, cancelled = threading.Event(), threading.Event()

    async def endless(item: dict[str, Any]) -> list[str]:
        started.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return []

    running.start(Worker(short_lease_broker.url, service=service, handler=endless, wait=2))
    with Client(short_lease_broker.url) as client:
        job_id = client.submit(unique("gina"), [service], ["G1"])
        assert started.wait(30)
        client.cancel(job_id)
        # The next heartbeat (every second under a 2 s lease) is refused: the worker gives up.
        assert cancelled.wait(10)


def test_a_killed_workers_items_are_finished_by_another_after_the_lease(
    short_lease_broker: Broker, running: Running
) -> None:
    service = unique("fragile")
    url = short_lease_broker.url
    with Client(url) as client:
        job_id = client.submit(unique("hank"), [service], ["A", "B", "C"])
        doomed = subprocess.Popen(
            [sys.executable, str(WORKER_PROCESS), url, service, "2", "600"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_until(lambda: count(client, job_id, "running") == 2, 30, "two items held")
        finally:
            doomed.send_signal(signal.SIGKILL)
            doomed.wait()
        held = {item["id"] for item in client.items(job_id, status="running")}

        running.start(Worker(url, service=service, handler=lambda item: [item["payload"]]))
        assert client.wait(job_id, timeout=30)["status"] == "successful"
        items = list(client.items(job_id))
        assert sorted(item["results"][0] for item in items) == ["A", "B", "C"]
        for item in items:
            assert item["attempt"] == (2 if item["id"] in held else 1)


def test_stop_finishes_held_items_and_claims_nothing_new(broker: Broker) -> None:
    service = unique("stoppable")
    release = threading.Event()

    def blocked(item: dict[str, Any]) -> list[Any]:
        assert release.wait(30)
        return [item["payload"]]

    worker = Worker(broker.url, service=service, handler=blocked, concurrency=2, wait=2)
    workers = Running()
    thread = workers.start(worker)
    with Client(broker.url) as client:
        job_id = client.submit(unique("iris"), [service], [1, 2, 3, 4])
        wait_until(lambda: count(client, job_id, "running") == 2, 30, "two items held")
        worker.stop()
        thread.join(timeout=0.5)
        assert thread.is_alive(), "run() returned while its items were still being worked"
        release.set()
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert workers.errors == []
        items = list(client.items(job_id))
        assert sorted(item["status"] for item in items) == [
            "ready",
            "ready",
            "successful",
            "successful",
        ]
        for item in items:
            if item["status"] == "ready":
                assert item["attempt"] == 0, "an item was claimed after stop()"


def test_stop_while_waiting_for_work_returns_at_once(broker: Broker) -> None:
    service = unique("idle")
    worker = Worker(broker.url, service=service, handler=lambda item: [], wait=30)
    workers = Running()
    thread = workers.start(worker)

    def waiting() -> bool:
        answer = httpx.get(f"{broker.url}/admin/waiting-workers").json()
        return service in str(answer)

    wait_until(waiting, 30, "the worker's long poll")
    stopped_at = time.monotonic()
    worker.stop()
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert time.monotonic() - stopped_at < 3
    assert workers.errors == []


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_finishes_the_held_item_and_exits(
    broker: Broker, signal_number: signal.Signals
) -> None:
    service = unique("terminated")
    with Client(broker.url) as client:
        job_id = client.submit(unique("jack"), [service], ["first", "second"])
        process = subprocess.Popen(
            [sys.executable, str(WORKER_PROCESS), broker.url, service, "1", "1.5"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_until(lambda: count(client, job_id, "running") == 1, 30, "an item held")
            process.send_signal(signal_number)
            _, stderr = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
        assert process.returncode == 0, stderr.decode()
        statuses = sorted((item["status"], item["attempt"]) for item in client.items(job_id))
        assert statuses == [("ready", 0), ("successful", 1)]
        assert b"stopping" in stderr


def test_sigterm_while_holding_an_item_and_long_polling_leaves_the_querier(
    broker: Broker,
) -> None:
    service = unique("leaving")
    with Client(broker.url) as client:
        job_id = client.submit(unique("nora"), [service], ["held"])
        # Two slots: one holds the item for 1.5 s while the other waits in a 30 s long poll.
        process = subprocess.Popen(
            [sys.executable, str(WORKER_PROCESS), broker.url, service, "2", "1.5", "30"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        querier = f"{socket.gethostname()}-{process.pid}"

        def long_polling() -> bool:
            return service in str(httpx.get(f"{broker.url}/admin/waiting-workers").json())

        try:
            wait_until(lambda: count(client, job_id, "running") == 1, 30, "the item held")
            wait_until(long_polling, 30, "the other slot's long poll")
            assert (querier_of(broker.url, querier) or {}).get("state") == "active"
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=30)
            exited = time.monotonic()
        finally:
            if process.poll() is None:
                process.kill()
        assert process.returncode == 0, stderr.decode()
        # The querier's shutdown ended the long poll: no waiting out its 30 s.
        assert exited - signalled < 10, stderr.decode()
        assert [(item["status"], item["attempt"]) for item in client.items(job_id)] == [
            ("successful", 1)
        ]
        assert count(client, job_id, "running") == 0
        wait_until(
            lambda: has_left(broker.url, querier),
            max(0.0, exited + 2 - time.monotonic()),
            f"querier {querier} to leave within 2 s of the exit: {querier_of(broker.url, querier)}",
        )


def test_stop_shuts_the_querier_down(broker: Broker) -> None:
    querier = unique("querier")
    worker = Worker(
        broker.url, service=unique("left"), handler=lambda item: [], querier=querier, wait=30
    )
    workers = Running()
    thread = workers.start(worker)
    wait_until(
        lambda: (querier_of(broker.url, querier) or {}).get("state") == "active",
        30,
        "the querier's first work request",
    )
    worker.stop()
    thread.join(timeout=10)
    assert not thread.is_alive()
    stopped = time.monotonic()
    assert workers.errors == []
    wait_until(
        lambda: has_left(broker.url, querier),
        max(0.0, stopped + 2 - time.monotonic()),
        f"querier {querier} to leave: {querier_of(broker.url, querier)}",
    )


def test_a_service_no_job_named_is_warned_about_once(
    broker: Broker, running: Running, caplog: pytest.LogCaptureFixture
) -> None:
    service = unique("misspelt")
    caplog.set_level(logging.INFO, logger="fairway_client.worker")
    worker = Worker(broker.url, service=service, handler=lambda item: [], wait=1)
    running.start(worker)
    time.sleep(3.5)  # three or four empty answers, each saying that no job named the service
    running.stop_all()
    warnings = [
        record.getMessage()
        for record in caplog.records
        if record.name == "fairway_client.worker" and "no job has named" in record.getMessage()
    ]
    assert len(warnings) == 1, warnings
    assert service in warnings[0]
    assert "waiting for work all the same" in warnings[0]


class Resends(logging.Handler):
    """Notices the worker's log line for a report sent again."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "sending it again" in record.getMessage():
            self.seen.set()


@pytest.fixture
def resends() -> Iterator[Resends]:
    handler = Resends()
    logger = logging.getLogger("fairway_client.worker")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def test_report_is_resent_after_a_broker_restart(
    broker_factory: Callable[..., Broker], resends: Resends, running: Running
) -> None:
    broker = broker_factory()
    service = unique("restarted")

    def handle(item: dict[str, Any]) -> list[str]:
        broker.stop()  # the broker goes away between the handler's end and its report
        return ["made it"]

    running.start(Worker(broker.url, service=service, handler=handle, wait=2))
    with Client(broker.url) as client:
        job_id = client.submit(unique("kate"), [service], ["G1"])
        assert resends.seen.wait(30), "the report was never sent again"
        broker.start()
        assert client.wait(job_id, timeout=30)["status"] == "successful"
        (item,) = client.items(job_id)
        assert (item["attempt"], item["results"]) == (1, ["made it"])


class LosingProxy(StandIn):
    """An HTTP proxy to a broker that loses the answer to the first successful report: it
    forwards it, restarts the broker, and closes the worker's connection without answering.
    Every report and its answer are recorded."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.reports: list[tuple[str, bytes, int, bytes]] = []
        self.lost = False
        self.restarted = threading.Event()

        def respond(request: BaseHTTPRequestHandler, body: bytes) -> None:
            try:
                answered = forward(request, broker.url, body)
            except httpx.HTTPError:
                request.close_connection = True
                return
            if request.path.endswith("/status") and b'"successful"' in body:
                self.reports.append((request.path, body, answered.status_code, answered.content))
                if not self.lost:
                    self.lost = True
                    broker.restart()
                    self.restarted.set()
                    request.close_connection = True
                    return  # the answer is lost
            answer(request, answered.status_code, answered.content)

        super().__init__(respond)


def test_a_report_whose_answer_was_lost_is_resent_and_answered_the_same(
    broker_factory: Callable[..., Broker], running: Running
) -> None:
    broker = broker_factory()
    proxy = LosingProxy(broker)
    service = unique("lossy")
    try:
        running.start(Worker(proxy.url, service=service, handler=lambda item: ["R1"], wait=2))
        with Client(broker.url) as client:
            job_id = client.submit(unique("liam"), [service], ["G1"])
            # Asked once the broker is back: a request during its restart gets no answer.
            assert proxy.restarted.wait(30), "the report never reached the proxy"
            assert client.wait(job_id, timeout=30)["status"] == "successful"
            (item,) = client.items(job_id)
            assert (item["attempt"], item["results"]) == (1, ["R1"])
        wait_until(lambda: len(proxy.reports) >= 2, 10, "the resent report")
        (first, second) = proxy.reports[:2]
        assert first[:2] == second[:2], "the resend is not the same report"
        assert first[2] == second[2] == 200, "the resend was refused"
        assert json.loads(first[3]) == json.loads(second[3])
    finally:
        running.stop_all()
        proxy.close()


class UnavailableBroker(StandIn):
    """A stand-in for a broker that answers every request 503 with ``Retry-After: 1``, counting
    the work requests and the querier shutdowns it gets. Once ``back`` is set it answers 404
    instead, as a broker that never saw the querier, so that the worker's shutdown ends."""

    def __init__(self) -> None:
        self.work_requests = 0
        self.shutdowns = 0
        self.back = False
        self.lock = threading.Lock()

        def respond(request: BaseHTTPRequestHandler, body: bytes) -> None:
            with self.lock:
                if request.command == "GET" and request.path.startswith("/work?"):
                    self.work_requests += 1
                if request.command == "POST" and request.path.endswith("/shutdown"):
                    self.shutdowns += 1
                back = self.back
            if back:
                status, error = 404, {"code": "querier_not_found", "message": "no querier"}
                headers = {"connection": "close"}
            else:
                status, error = 503, {"code": "shutting_down", "message": "stopping"}
                headers = {"retry-after": "1", "connection": "close"}
            answer(request, status, json.dumps({"error": error}).encode(), headers)

        super().__init__(respond)


def test_a_worker_facing_a_broker_answering_only_503_asks_about_once_a_second(
    running: Running,
) -> None:
    stand_in = UnavailableBroker()
    try:
        worker = Worker(
            stand_in.url, service=unique("unavailable"), handler=lambda item: [], concurrency=8
        )
        thread = running.start(worker)
        window = 4.0
        time.sleep(window)
        with stand_in.lock:
            sent = stand_in.work_requests
            stand_in.back = True
        worker.stop()
        thread.join(timeout=15)
        assert not thread.is_alive(), "the worker did not stop"
    finally:
        stand_in.close()
    # Eight slots ask at once at first; after that, about one request per Retry-After.
    assert sent >= 3, f"the worker stopped asking: {sent}"
    assert sent <= 8 + 10, f"{sent} work requests in {window:g} s"
    assert stand_in.shutdowns >= 1, "the worker did not shut its querier down"
    assert running.errors == []


def test_a_worker_reaches_an_https_broker_with_a_private_ca(
    tls_broker: TlsBroker, running: Running
) -> None:
    service = unique("tls-worker")
    running.start(
        Worker(
            tls_broker.url,
            service=service,
            handler=lambda item: ["R1"],
            wait=2,
            verify=tls_broker.ca,
        )
    )
    with Client(tls_broker.url, verify=tls_broker.ca) as client:
        job_id = client.submit(unique("mia"), [service], ["G1"])
        assert client.wait(job_id, timeout=30)["status"] == "successful"
        assert list(client.results(job_id)) == ["R1"]
    with pytest.raises(FileNotFoundError):
        Worker(tls_broker.url, service=service, handler=lambda item: [], verify="/no/such/ca.pem")


def test_default_querier_is_host_and_pid() -> None:
    querier = default_querier()
    assert querier.endswith(f"-{os.getpid()}")
    assert len(querier) > len(str(os.getpid())) + 1
    # The process's first worker without a querier is `querier`; the next ones add a number,
    # since a worker that stopped shut its querier down.
    first = Worker("http://127.0.0.1:1", service="s", handler=lambda item: [])
    second = Worker("http://127.0.0.1:1", service="s", handler=lambda item: [])
    assert re.fullmatch(re.escape(querier) + r"(-\d+)?", first.querier)
    assert re.fullmatch(re.escape(querier) + r"-\d+", second.querier)
    assert first.querier != second.querier


def test_heartbeat_period_is_half_the_lease() -> None:
    assert parse_timestamp("2030-01-01T00:00:00.123456789Z") is not None
    assert parse_timestamp("not a time") is None
    soon = time.time() + 10
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(soon)) + ".5Z"
    assert 4.0 < heartbeat_period(stamp) <= 5.3
    assert heartbeat_period(None) == 10.0


# Brokers away: a worker keeps each report until a broker takes it, moves on to the next broker
# given several, and says truly in its last line what became of the items it took.


def runs_of(path: Path, what: str = "start") -> list[int]:
    """The ids of the items whose runs ``worker_process.py`` recorded in ``path`` as ``what``
    (``start`` or ``done``), each as often as it did."""
    text = path.read_text() if path.exists() else ""
    return sorted(int(line.split()[1]) for line in text.splitlines() if line.startswith(what))


def last_line_after_sigterm(process: subprocess.Popen[bytes], log: Path) -> str:
    """Stops a worker process with SIGTERM; answers the last line it logged."""
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)
    lines = log.read_text(errors="replace").splitlines()
    assert process.returncode == 0, "\n".join(lines[-30:])
    return lines[-1] if lines else ""


class Runs:
    """A handler that records each run of an item and takes ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started: list[int] = []
        self.lock = threading.Lock()

    def __call__(self, item: dict[str, Any]) -> list[Any]:
        with self.lock:
            self.started.append(item["id"])
        time.sleep(self.seconds)
        return [item["payload"]]

    def count(self) -> int:
        with self.lock:
            return len(self.started)


class WorkerLog(logging.Handler):
    """The worker's lines of log, as they come."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def worker_log() -> Iterator[WorkerLog]:
    handler = WorkerLog()
    logger = logging.getLogger("fairway_client.worker")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_reports_wait_for_a_broker_away_fifteen_seconds_and_nothing_runs_twice(
    broker_factory: Callable[..., Broker], tmp_path: Path
) -> None:
    broker = broker_factory()
    service = unique("away")
    runs, log = tmp_path / "runs", tmp_path / "worker.log"
    with Client(broker.url) as client:
        job_id = client.submit(unique("olga"), [service], ["A", "B", "C"])
    with log.open("wb") as output:
        worker = subprocess.Popen(
            [sys.executable, str(WORKER_PROCESS), broker.url, service, "3", "3", "1", str(runs)],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        # Every slot runs its handler, so no work request is under way when the broker goes.
        wait_until(lambda: len(runs_of(runs)) == 3, 30, "the three items started")
        broker.kill()
        gone = time.monotonic()
        # The handlers end while the broker is away: their reports wait.
        wait_until(lambda: len(runs_of(runs, "done")) == 3, 10, "the three handlers done")
        time.sleep(max(0.0, gone + 15 - time.monotonic()))  # the outage, 15 s on purpose
        broker.start()  # on the same address
        back = time.monotonic()
        with Client(broker.url) as client:
            assert client.wait(job_id, timeout=30)["status"] == "successful"
            after = time.monotonic() - back
            assert after < 8, f"the job finished {after:.1f} s after the broker came back"
            items = list(client.items(job_id))
        assert [item["attempt"] for item in items] == [1, 1, 1]
        assert sorted(item["results"][0] for item in items) == ["A", "B", "C"]
        assert runs_of(runs) == sorted(item["id"] for item in items), "an item ran twice"
        last = last_line_after_sigterm(worker, log)
        assert last.endswith("stopped: every item taken was reported"), last
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_a_worker_given_two_brokers_carries_on_when_one_stops_for_good(
    broker_factory: Callable[..., Broker], running: Running, worker_log: WorkerLog
) -> None:
    first, second = broker_factory(), broker_factory()
    service = unique("two-brokers")
    handler = Runs(1.0)
    worker = Worker([first.url, second.url], service=service, handler=handler, concurrency=2)
    with Client(f"{first.url},{second.url}") as client:
        job_id = client.submit(unique("pavel"), [service], list(range(8)))
        thread = running.start(worker)
        # Both slots run their handlers when the first broker goes: their reports, and every
        # request after them, go to the second.
        wait_until(lambda: handler.count() >= 2, 30, "both slots at work")
        first.kill()
        assert client.wait(job_id, timeout=60)["status"] == "successful"
        items = list(client.items(job_id))
    assert [item["attempt"] for item in items] == [1] * 8
    assert sorted(handler.started) == sorted(item["id"] for item in items), "an item ran twice"
    worker.stop()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert running.errors == []
    assert worker_log.lines[-1] == "stopped: every item taken was reported"


def test_a_worker_stopped_while_no_broker_answers_names_what_it_could_not_report(
    broker_factory: Callable[..., Broker], running: Running, worker_log: WorkerLog
) -> None:
    broker = broker_factory()
    service = unique("unreported")
    handler = Runs(0.5)
    worker = Worker(broker.url, service=service, handler=handler, stop_timeout=2)
    with Client(broker.url) as client:
        job_id = client.submit(unique("quentin"), [service], ["G1"])
        thread = running.start(worker)
        wait_until(lambda: handler.count() == 1, 30, "the item started")
        broker.kill()
        wait_until(
            lambda: any("keeping it" in line for line in worker_log.lines), 10, "a report kept"
        )
        stopped = time.monotonic()
        worker.stop()
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert 2 <= time.monotonic() - stopped < 6, "the stop timeout is not kept"
        (item_id,) = handler.started
        (unreported,) = worker.unreported
        assert (unreported["id"], unreported["attempt"], unreported["working"]) == (
            item_id,
            1,
            False,
        )
        last = worker_log.lines[-1]
        assert "every item taken was reported" not in last
        assert last.startswith("stopped: 1 of the 1 item(s) taken were not reported"), last
        expected = (
            f"item {item_id} (attempt 1, report waiting for a broker, "
            f"lease ends {unreported['lease_expires_at']})"
        )
        assert expected in last, last
        # Back, the broker has the item running still: it runs again once its lease ends.
        broker.start()
        assert client.job(job_id)["status"] == "running"


def test_a_report_refused_or_past_its_lease_is_not_called_reported(
    broker_factory: Callable[..., Broker], running: Running, worker_log: WorkerLog
) -> None:
    broker = broker_factory("--lease", "2s", "--reap-interval", "500ms")
    service = unique("let-go")
    user = unique("rita")
    seen: list[str] = []
    with Client(broker.url) as client:
        jobs = [client.submit(user, [service], [name]) for name in ("first", "second")]

        def handle(item: dict[str, Any]) -> list[Any]:
            seen.append(item["job_id"])
            if len(seen) == 1:
                client.cancel(item["job_id"])  # its report is refused: the attempt has ended
            else:
                broker.kill()  # no broker takes its report before its 2 s lease ends
            return ["done"]

        # A stop timeout that ends the querier's shutdown, which no broker answers, soon.
        worker = Worker(broker.url, service=service, handler=handle, wait=1, stop_timeout=1)
        thread = running.start(worker)
        wait_until(
            lambda: any("lease ended" in line for line in worker_log.lines), 30, "a lease ended"
        )
        worker.stop()
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert sorted(seen) == sorted(jobs)
        assert worker.unreported == []
        last = worker_log.lines[-1]
        assert last.startswith("stopped: 2 of the 2 item(s) taken were not reported"), last
        assert "2 no longer this worker's to report" in last, last
        assert "report refused" in last, last
        assert "no broker took the report before its lease ended at 20" in last, last
        broker.start()
        assert client.job(seen[0])["status"] == "canceled"


class DelayingProxy(StandIn):
    """An HTTP proxy to a broker that answers every report but a heartbeat 503 until
    ``until`` (time.monotonic()), as a broker that cannot write would; it forwards the rest."""

    def __init__(self, broker: Broker, until: float) -> None:
        self.broker = broker
        self.until = until
        self.heartbeats_meanwhile = 0

        def respond(request: BaseHTTPRequestHandler, body: bytes) -> None:
            if request.path.endswith("/status") and time.monotonic() < self.until:
                if b'"running"' not in body:
                    answer(request, 503, b'{"error":{"code":"unavailable","message":"away"}}')
                    return
                self.heartbeats_meanwhile += 1
            answered = forward(request, broker.url, body)
            answer(request, answered.status_code, answered.content)

        super().__init__(respond)


def test_heartbeats_keep_the_lease_while_a_report_waits(
    broker_factory: Callable[..., Broker], running: Running
) -> None:
    broker = broker_factory("--lease", "2s", "--reap-interval", "500ms")
    proxy = DelayingProxy(broker, until=float("inf"))
    service = unique("kept")
    handler = Runs(0.0)
    try:
        with Client(broker.url) as client:
            job_id = client.submit(unique("sam"), [service], ["G1"])
            # Reports wait 6 s, three leases of 2 s, from the first.
            proxy.until = time.monotonic() + 6
            running.start(Worker(proxy.url, service=service, handler=handler, wait=1))
            assert client.wait(job_id, timeout=30)["status"] == "successful"
            (item,) = client.items(job_id)
            assert (item["attempt"], item["results"]) == (1, ["G1"])
            assert handler.started == [item["id"]], "the item ran twice"
            assert proxy.heartbeats_meanwhile >= 3
    finally:
        running.stop_all()
        proxy.close()


def test_a_heartbeats_answer_says_when_the_lease_ends() -> None:
    claimed = time.time() + 10
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(claimed)) + ".25Z"
    held = _Held({"id": 7, "attempt": 2, "lease_expires_at": stamp})
    left = held.left()
    assert left is not None
    assert 9 < left <= 10.3
    # The broker says when the lease now ends...
    held.extended({"id": 7, "status": "running", "lease_expires_at": "2030-01-01T00:00:00Z"})
    assert held.lease_ends == parse_timestamp("2030-01-01T00:00:00Z")
    # ...or, an older broker, does not: then a whole lease, as long as the claim's, from now.
    held = _Held({"id": 7, "attempt": 2, "lease_expires_at": stamp})
    held.lease_ends = datetime.now(timezone.utc) + timedelta(seconds=1)  # 9 s later
    held.extended({"id": 7, "status": "running"})
    left = held.left()
    assert left is not None
    assert 9 < left <= 10.3
    assert _Held({"id": 8, "attempt": 1}).left() is None
