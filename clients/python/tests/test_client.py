"""The producer side: submitting, waiting, reading back, steering, and the errors."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conftest import Broker, free_port, unique
from fairway_client import AsyncClient, Client, FairwayError


def work_all(client: Client, service: str, results: Any = None) -> int:
    """Claims and succeeds every ready item of ``service``; returns how many."""
    done = 0
    while True:
        items = client.claim(service, "test-querier", max=100)
        if not items:
            return done
        for item in items:
            reported = results(item) if callable(results) else [item["payload"]]
            client.succeed(item["id"], item["attempt"], reported)
            done += 1


def test_submit_wait_and_read_back_across_pages(broker: Broker) -> None:
    service = unique("subsetter")
    with Client(broker.url) as client:
        job_id = client.submit(
            user=unique("alice"),
            steps=[service],
            items=[{"granule": f"G{n}"} for n in range(7)],
            is_async=False,
            priority=5,
            metadata={"mode": "preview", "n": 7},
        )
        job = client.job(job_id)
        assert job["status"] in {"accepted", "running"}
        assert job["priority"] == 5
        assert job["metadata"] == {"mode": "preview", "n": 7}
        assert work_all(client, service, lambda item: [item["payload"]["granule"] + ".nc"]) == 7

        done = client.wait(job_id, timeout=30)
        assert done["status"] == "successful"
        assert done["progress"] == 100

        pages = list(client.results_pages(job_id, page_size=3))
        assert len(pages) == 3
        assert [len(page["results"]) for page in pages] == [3, 3, 1]
        assert list(client.results(job_id, page_size=3)) == [f"G{n}.nc" for n in range(7)]
        assert list(client.errors(job_id)) == []

        items = list(client.items(job_id, page_size=2))
        assert [item["payload"]["granule"] for item in items] == [f"G{n}" for n in range(7)]
        assert list(client.items(job_id, status="failed")) == []
        assert len(list(client.items(job_id, status="successful", step=0, page_size=4))) == 7


def test_submit_raw_failed_items_and_listing_filters(broker: Broker) -> None:
    service, user = unique("render"), unique("bob")
    with Client(broker.url) as client:
        answer = client.submit_raw(
            {
                "user": user,
                "steps": [{"service": service}],
                "items": [{"payload": 1}, {"payload": 2}, {"payload": 3, "component": "c"}],
            }
        )
        job_id = answer["job_id"]
        assert answer["status"] == "accepted"
        items = client.claim(service, "q", max=3)
        assert len(items) == 3
        by_payload = {item["payload"]: item for item in items}
        client.succeed(by_payload[1]["id"], 1, ["one"])
        client.fail(by_payload[2]["id"], 1, "no such granule", retryable=False)
        client.succeed(by_payload[3]["id"], 1, ["three"])
        job = client.wait(job_id, timeout=30)
        assert job["status"] == "complete_with_errors"
        assert list(client.results(job_id)) == ["one", "three"]
        errors = list(client.errors(job_id))
        assert [error["error"] for error in errors] == ["no such granule"]
        failed = list(client.items(job_id, status="failed"))
        assert [item["payload"] for item in failed] == [2]
        assert [job["job_id"] for job in client.jobs(user)] == [job_id]


def test_pause_resume_cancel(broker: Broker) -> None:
    service = unique("steered")
    with Client(broker.url) as client:
        job_id = client.submit(unique("carol"), [service], ["a", "b"])
        assert client.pause(job_id)["status"] == "paused"
        assert client.claim(service, "q", max=2) == []
        assert client.resume(job_id)["status"] != "paused"
        assert client.cancel(job_id)["status"] == "canceled"
        assert client.wait(job_id, timeout=5)["status"] == "canceled"
        with pytest.raises(FairwayError) as refused:
            client.pause(job_id)
        assert refused.value.status == 409


def test_wait_times_out(broker: Broker) -> None:
    with Client(broker.url) as client:
        job_id = client.submit(unique("dave"), [unique("idle")], [1])
        with pytest.raises(TimeoutError):
            client.wait(job_id, timeout=1.5)


def test_errors_carry_status_code_and_message(broker: Broker) -> None:
    with Client(broker.url) as client:
        with pytest.raises(FairwayError) as bad_body:
            client.submit_raw({"user": 5, "steps": [{"service": "s"}], "items": [{"payload": 1}]})
        assert bad_body.value.status == 400
        assert bad_body.value.code == "invalid_body"
        assert "expected a string" in bad_body.value.message

        with pytest.raises(FairwayError) as no_steps:
            client.submit_raw({"user": "erin", "steps": [], "items": [{"payload": 1}]})
        assert (no_steps.value.status, no_steps.value.code) == (400, "invalid_steps")
        assert no_steps.value.message == "a job needs at least one step"

        with pytest.raises(FairwayError) as bad_step:
            client.submit("erin", [{"service": "s", "aggregate": True}], [1])
        assert bad_step.value.status == 400
        assert "aggregate" in bad_step.value.message

        unknown = "00000000-0000-0000-0000-000000000000"
        with pytest.raises(FairwayError) as missing:
            client.job(unknown)
        assert missing.value.status == 404
        assert missing.value.code == "job_not_found"
        assert missing.value.message
        assert str(missing.value).startswith(missing.value.message)

        with pytest.raises(FairwayError) as bad_query:
            list(client.items(unknown, status="exploded"))
        assert bad_query.value.status == 400
        assert bad_query.value.code == "invalid_query"


def test_transport_failure_has_no_status() -> None:
    with Client(f"http://127.0.0.1:{free_port()}") as client, pytest.raises(FairwayError) as down:
        client.job("00000000-0000-0000-0000-000000000000")
    assert down.value.status is None
    assert down.value.code == "transport"
    assert down.value.is_transient
    assert not Client(f"http://127.0.0.1:{free_port()}").ready()


def test_url_and_token_from_the_environment(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAIRWAY_URL", broker.url + "/")
    monkeypatch.setenv("FAIRWAY_TOKEN", "not-checked-while-auth-is-off")
    with Client() as client:
        assert client.url == broker.url
        assert client.ready()
    monkeypatch.delenv("FAIRWAY_URL")
    assert Client().url == "http://127.0.0.1:8080"
    with pytest.raises(ValueError, match="http://"):
        Client("127.0.0.1:8080")


def test_async_client(broker: Broker) -> None:
    service = unique("async")

    async def scenario() -> None:
        async with AsyncClient(broker.url) as client:
            job_id = await client.submit(unique("frank"), [service], [1, 2, 3], is_async=False)
            items = await client.claim(service, "q", max=3, wait=1)
            for item in items:
                await client.succeed(item["id"], item["attempt"], [item["payload"] * 10])
            job = await client.wait(job_id, timeout=30)
            assert job["status"] == "successful"
            assert [result async for result in client.results(job_id, page_size=2)] == [10, 20, 30]
            statuses = [item["status"] async for item in client.items(job_id, page_size=1)]
            assert statuses == ["successful"] * 3
            with pytest.raises(FairwayError) as missing:
                await client.job("00000000-0000-0000-0000-000000000000")
            assert missing.value.code == "job_not_found"

    asyncio.run(scenario())
