"""The producer side: submitting, waiting, reading back, steering, and the errors."""

from __future__ import annotations

import asyncio
import ssl
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler
from typing import Any

import httpx
import pytest

from conftest import Broker, StandIn, TlsBroker, answer, free_port, unique, wait_until
from fairway_client import (
    AsyncClient,
    Client,
    FairwayError,
    RetryPolicy,
    ServicePolicy,
    TenantPolicy,
    UserPolicy,
)


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


def test_release_hands_an_item_back_without_spending_its_attempt(broker: Broker) -> None:
    service = unique("handed-back")
    with Client(broker.url) as client:
        job_id = client.submit(unique("quinn"), [service], ["G1"], retry={"max_attempts": 1})
        (item,) = client.claim(service, "q")
        answer = client.release(item["id"], 1, "scratch disk full")
        assert answer == {"id": item["id"], "status": "ready"}
        # Sent again (its answer lost, say), the same release gets the same answer.
        assert client.release(item["id"], 1, "scratch disk full") == answer
        (listed,) = client.items(job_id)
        assert (listed["status"], listed["releases"], listed["release_reason"]) == (
            "ready",
            1,
            "scratch disk full",
        )
        (again,) = client.claim(service, "q")
        assert again["attempt"] == 2
        # The released attempt is over: a late report of it is stale.
        with pytest.raises(FairwayError) as stale:
            client.succeed(item["id"], 1, ["late"])
        assert stale.value.status == 409
        # One attempt allowed, and this is the second: the release did not count.
        assert client.fail(again["id"], 2, "timeout")["status"] == "failed"

        job_id = client.submit(unique("quinn"), [service], ["G2"])
        (item,) = client.claim(service, "q")
        with pytest.raises(FairwayError) as refused:
            client.release(item["id"], 1, "x" * 1001)
        assert (refused.value.status, refused.value.code) == (400, "invalid_body")

    async def scenario() -> None:
        async with AsyncClient(broker.url) as client:
            assert await client.release(item["id"], 1) == {"id": item["id"], "status": "ready"}
            (listed,) = [each async for each in client.items(job_id)]
            assert listed["releases"] == 1
            assert "release_reason" not in listed

    asyncio.run(scenario())


def utc_text(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_submit_with_a_retry_policy(broker: Broker) -> None:
    service, user = unique("flaky"), unique("grace")
    with Client(broker.url) as client:
        policy: RetryPolicy = {
            "max_attempts": 2,
            "backoff": "none",
            "initial": timedelta(milliseconds=1500),
            "max": 90,
        }
        job_id = client.submit(user, [service], ["G1"], retry=policy)
        assert client.job(job_id)["retry"] == {
            "max_attempts": 2,
            "backoff": "none",
            "initial": "1s 500ms",
            "max": "1m 30s",
        }
        # Two attempts, where the broker's default would give four.
        (item,) = client.claim(service, "q")
        assert client.fail(item["id"], 1, "timeout")["status"] == "ready"
        (item,) = client.claim(service, "q")
        assert item["attempt"] == 2
        assert client.fail(item["id"], 2, "timeout")["status"] == "failed"
        assert client.wait(job_id, timeout=10)["status"] == "failed"

        # A delay: the retry waits as scheduled.
        delayed = client.submit(
            user, [service], ["G2"], retry={"backoff": "fixed", "initial": "1h"}
        )
        (item,) = client.claim(service, "q")
        assert client.fail(item["id"], 1, "timeout")["status"] == "scheduled"
        assert [item["status"] for item in client.items(delayed)] == ["scheduled"]
        assert client.claim(service, "q") == []

        with pytest.raises(FairwayError) as refused:
            client.submit(user, [service], ["G3"], retry={"max_attempts": 0})
        assert (refused.value.status, refused.value.code) == (400, "invalid_retry")
        assert "retry.max_attempts" in refused.value.message
        with pytest.raises(ValueError, match="negative"):
            client.submit(user, [service], ["G4"], retry={"initial": -1})
        assert len(list(client.jobs(user))) == 2


def test_submit_with_not_before(broker: Broker) -> None:
    later_service, soon_service, user = unique("later"), unique("soon"), unique("heidi")
    with Client(broker.url) as client:
        # Any time zone: the broker gets the same instant in UTC.
        eastern = timezone(timedelta(hours=-5))
        later = (datetime.now(eastern) + timedelta(hours=1)).replace(microsecond=0)
        job_id = client.submit(user, [later_service], ["G1", "G2"], not_before=later)
        job = client.job(job_id)
        assert job["not_before"] == utc_text(later)
        assert job["steps"][0]["scheduled"] == 2
        items = list(client.items(job_id))
        assert [item["status"] for item in items] == ["scheduled", "scheduled"]
        assert [item["not_before"] for item in items] == [utc_text(later)] * 2
        assert client.claim(later_service, "q", max=2) == []

        soon = datetime.now(timezone.utc) + timedelta(seconds=1.5)
        soon_id = client.submit(user, [soon_service], ["G3"], not_before=soon)
        assert client.claim(soon_service, "q") == []
        claimed: list[dict[str, Any]] = []

        def claim_soon() -> bool:
            claimed.extend(client.claim(soon_service, "q", wait=1))
            return bool(claimed)

        wait_until(claim_soon, 10, "the scheduled item to become claimable")
        assert claimed[0]["job_id"] == soon_id
        assert datetime.now(timezone.utc) >= soon

        past = datetime.now(timezone.utc) - timedelta(minutes=1)
        past_id = client.submit(user, [soon_service], ["G4"], not_before=past)
        assert [item["status"] for item in client.items(past_id)] == ["ready"]

        with pytest.raises(ValueError, match="timezone-aware"):
            client.submit(user, [later_service], ["G5"], not_before=datetime(2030, 1, 1))
        assert len(list(client.jobs(user))) == 3


def test_submit_with_an_idempotency_key(broker: Broker) -> None:
    service, user = unique("nightly"), unique("ivan")
    key = unique("nightly-2030-01-01")
    start = datetime.now(timezone.utc) + timedelta(hours=1)
    with Client(broker.url) as client:

        def submit(items: list[str], not_before: datetime = start) -> str:
            return client.submit(
                user,
                [service],
                items,
                retry={"max_attempts": 3},
                not_before=not_before,
                idempotency_key=key,
            )

        job_id = submit(["G1"])
        assert submit(["G1"]) == job_id
        # The same instant in another zone is the same submission.
        assert submit(["G1"], start.astimezone(timezone(timedelta(hours=9)))) == job_id
        with pytest.raises(FairwayError) as reused:
            submit(["G2"])
        assert (reused.value.status, reused.value.code) == (409, "idempotency_key_reused")
        assert [job["job_id"] for job in client.jobs(user)] == [job_id]

        body = {"user": user, "steps": [{"service": service}], "items": [{"payload": "G9"}]}
        raw = client.submit_raw(body, idempotency_key=key + "-raw")
        assert client.submit_raw(body, idempotency_key=key + "-raw") == raw
        assert raw["job_id"] != job_id
        # Without a key, each submission is a job of its own.
        assert client.submit(user, [service], ["G1"]) != client.submit(user, [service], ["G1"])

        for bad in ["", "k" * 256, "naïve", "line\nbreak"]:
            with pytest.raises(ValueError, match="printable ASCII"):
                client.submit(user, [service], ["G1"], idempotency_key=bad)
        assert len(list(client.jobs(user))) == 4


def test_async_submit_with_a_retry_policy_and_not_before(broker: Broker) -> None:
    service, user = unique("async-later"), unique("judy")
    later = (datetime.now(timezone.utc) + timedelta(hours=1)).replace(microsecond=0)

    async def scenario() -> None:
        async with AsyncClient(broker.url) as client:
            job_id = await client.submit(
                user,
                [service],
                [1, 2],
                retry={"max_attempts": 5, "backoff": "exponential", "initial": 2, "max": "1m"},
                not_before=later,
            )
            job = await client.job(job_id)
            assert job["retry"] == {
                "max_attempts": 5,
                "backoff": "exponential",
                "initial": "2s",
                "max": "1m",
            }
            assert job["not_before"] == utc_text(later)
            statuses = [item["status"] async for item in client.items(job_id)]
            assert statuses == ["scheduled", "scheduled"]
            assert await client.claim(service, "q", max=2) == []
            with pytest.raises(ValueError, match="timezone-aware"):
                await client.submit(user, [service], [3], not_before=datetime(2030, 1, 1))

    asyncio.run(scenario())


def test_async_submit_with_an_idempotency_key(broker: Broker) -> None:
    service, user, key = unique("async-nightly"), unique("ken"), unique("key")

    async def scenario() -> None:
        async with AsyncClient(broker.url) as client:
            job_id = await client.submit(user, [service], ["G1"], idempotency_key=key)
            assert await client.submit(user, [service], ["G1"], idempotency_key=key) == job_id
            with pytest.raises(FairwayError) as reused:
                await client.submit(user, [service], ["G2"], idempotency_key=key)
            assert (reused.value.status, reused.value.code) == (409, "idempotency_key_reused")
            body = {"user": user, "steps": [{"service": service}], "items": [{"payload": "G3"}]}
            raw = await client.submit_raw(body, idempotency_key=key + "-raw")
            assert await client.submit_raw(body, idempotency_key=key + "-raw") == raw
            assert [job["job_id"] async for job in client.jobs(user)] == [raw["job_id"], job_id]

    asyncio.run(scenario())


def test_https_with_a_private_ca(tls_broker: TlsBroker, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    service = unique("tls")
    with Client(tls_broker.url, verify=tls_broker.ca) as client:
        job_id = client.submit(unique("liz"), [service], ["G1"], idempotency_key="tls")
        assert client.job(job_id)["status"] == "accepted"
    context = ssl.create_default_context(cafile=tls_broker.ca)
    assert Client(tls_broker.url, verify=context).ready()
    assert Client(tls_broker.url, verify=False).ready()

    with Client(tls_broker.url) as untrusting, pytest.raises(FairwayError) as refused:
        untrusting.job(job_id)
    assert refused.value.code == "transport"
    assert "CERTIFICATE_VERIFY_FAILED" in refused.value.message
    # What fairway-harmony, which leaves verify alone, relies on.
    monkeypatch.setenv("SSL_CERT_FILE", tls_broker.ca)
    assert Client(tls_broker.url).ready()

    with pytest.raises(ValueError, match="http= client"):
        Client(tls_broker.url, verify=tls_broker.ca, http=httpx.Client())
    with pytest.raises(FileNotFoundError):
        Client(tls_broker.url, verify=tls_broker.ca + ".missing")

    async def scenario() -> None:
        async with AsyncClient(tls_broker.url, verify=tls_broker.ca) as client:
            assert (await client.job(job_id))["job_id"] == job_id

    asyncio.run(scenario())


def test_service_policy_set_before_work_read_back_and_changed_a_field_at_a_time(
    broker: Broker,
) -> None:
    service = unique("capped")
    with Client(broker.url) as client:
        # No job names the service yet, and it has no policy.
        with pytest.raises(FairwayError) as missing:
            client.service_policy(service)
        assert (missing.value.status, missing.value.code) == (404, "service_not_found")

        expected: ServicePolicy = {
            "service": service,
            "max_running": 2,
            "rate_per_second": 0.0,
            "burst": 1,
            "running": 0,
        }
        assert client.set_service_policy(service, max_running=2) == expected
        assert client.service_policy(service) == expected

        changed = client.set_service_policy(service, burst=5)
        assert changed == {**expected, "burst": 5}
        assert client.service_policy(service) == changed

        with pytest.raises(FairwayError) as refused:
            client.set_service_policy(service, burst=0)
        assert (refused.value.status, refused.value.code) == (400, "invalid_policy")
        assert refused.value.message.startswith("burst:")
        assert client.service_policy(service) == changed

        # The cap holds: of three ready items, a claim gets two.
        client.submit(unique("mia"), [service], ["G1", "G2", "G3"])
        assert len(client.claim(service, "q", max=3)) == 2
        assert client.service_policy(service)["running"] == 2
        lifted = client.set_service_policy(service, max_running=0, rate_per_second=0.5)
        assert (lifted["max_running"], lifted["rate_per_second"], lifted["burst"]) == (0, 0.5, 5)


def test_async_service_policy(broker: Broker) -> None:
    service = unique("async-capped")

    async def scenario() -> None:
        async with AsyncClient(broker.url) as client:
            with pytest.raises(FairwayError) as missing:
                await client.service_policy(service)
            assert (missing.value.status, missing.value.code) == (404, "service_not_found")
            policy = await client.set_service_policy(service, rate_per_second=2.5, burst=3)
            assert policy == {
                "service": service,
                "max_running": 0,
                "rate_per_second": 2.5,
                "burst": 3,
                "running": 0,
            }
            assert await client.service_policy(service) == policy
            with pytest.raises(FairwayError) as refused:
                await client.set_service_policy(service, max_running=-1)
            assert (refused.value.status, refused.value.code) == (400, "invalid_policy")
            assert refused.value.message.startswith("max_running:")

    asyncio.run(scenario())


def test_user_policy_set_before_work_read_back_and_changed_a_field_at_a_time(
    broker: Broker,
) -> None:
    user = unique("weighted")
    with Client(broker.url) as client:
        # The user has no work and no policy yet.
        with pytest.raises(FairwayError) as missing:
            client.user_policy(user)
        assert (missing.value.status, missing.value.code) == (404, "user_not_found")

        expected: UserPolicy = {
            "user": user,
            "weight": 3,
            "tier": 3,
            "max_running": 2,
            "rate_per_second": 0.0,
            "burst": 1,
            "running": 0,
            "at_cap": False,
            "throttled_until": None,
        }
        assert client.set_user_policy(user, weight=3, max_running=2) == expected
        assert client.user_policy(user) == expected

        changed = client.set_user_policy(user, rate_per_second=0.5, burst=4)
        assert changed == {**expected, "rate_per_second": 0.5, "burst": 4}
        assert client.user_policy(user) == changed

        with pytest.raises(FairwayError) as refused:
            client.set_user_policy(user, weight=0, max_running=7)
        assert (refused.value.status, refused.value.code) == (400, "invalid_policy")
        assert refused.value.message.startswith("weight")
        # Refused as a whole: the valid max_running beside it is not applied either.
        assert client.user_policy(user) == changed


def test_a_tier_set_on_a_user_and_a_tenant_reads_back_and_one_out_of_range_is_refused(
    broker: Broker,
) -> None:
    user, tenant = unique("tiered"), unique("tiered-acme")
    with Client(broker.url) as client:
        policy = client.set_user_policy(user, weight=2, tier=1)
        assert (policy["weight"], policy["tier"]) == (2, 1)
        assert client.user_policy(user) == policy

        created = client.set_tenant_policy(tenant, max_outstanding=10)
        # A tenant with no tier set is in the middle one.
        assert created["tier"] == 3
        changed = client.set_tenant_policy(tenant, tier=5)
        assert (changed["tier"], changed["weight"], changed["max_outstanding"]) == (5, 1, 10)
        assert client.tenant_policy(tenant) == changed

        for tier in (0, 6):
            with pytest.raises(FairwayError) as refused:
                client.set_user_policy(user, tier=tier, max_running=7)
            assert (refused.value.status, refused.value.code) == (400, "invalid_policy")
            assert refused.value.message.startswith("tier: ")
            with pytest.raises(FairwayError) as refused:
                client.set_tenant_policy(tenant, tier=tier)
            assert (refused.value.status, refused.value.code) == (400, "invalid_policy")
            assert refused.value.message.startswith("tier: ")
        # Refused as a whole: neither key's policy changed.
        assert client.user_policy(user) == policy
        assert client.tenant_policy(tenant) == changed


def test_a_user_capped_at_one_running_item_gets_its_next_once_the_first_ends(
    broker: Broker,
) -> None:
    user, service = unique("capped-user"), unique("user-cap")
    with Client(broker.url) as client:
        client.set_user_policy(user, max_running=1)
        client.submit(user, [service], ["G1", "G2", "G3"])

        (first,) = client.claim(service, "q", max=3)
        policy = client.user_policy(user)
        assert (policy["running"], policy["at_cap"]) == (1, True)
        assert client.claim(service, "q", max=3) == []

        client.succeed(first["id"], first["attempt"], [first["payload"]])
        (second,) = client.claim(service, "q", max=3)
        assert second["payload"] != first["payload"]
        assert client.claim(service, "q", max=3) == []


def test_tenant_policy_keeps_fields_left_out_and_returns_the_new_ones(broker: Broker) -> None:
    tenant = unique("acme")
    with Client(broker.url) as client:
        with pytest.raises(FairwayError) as missing:
            client.tenant_policy(tenant)
        assert (missing.value.status, missing.value.code) == (404, "tenant_not_found")

        created = client.set_tenant_policy(tenant, max_queriers=0, max_outstanding=100)
        assert (created["tenant"], created["max_queriers"], created["max_outstanding"]) == (
            tenant,
            0,
            100,
        )
        # A tenant with no policy set: weight 1, no cap, no rate limit.
        assert (created["weight"], created["max_running"], created["rate_per_second"]) == (
            1,
            0,
            0.0,
        )

        changed = client.set_tenant_policy(
            tenant, weight=2, max_running=5, rate_per_second=1.5, burst=3
        )
        # The new fields as given, and everything else as it was (but the time of the change).
        expected: TenantPolicy = {
            **created,
            "weight": 2,
            "max_running": 5,
            "rate_per_second": 1.5,
            "burst": 3,
            "updated_at": changed["updated_at"],
        }
        assert changed == expected
        assert client.tenant_policy(tenant) == changed

        limited = client.set_tenant_policy(tenant, max_outstanding=50)
        assert limited == {**changed, "max_outstanding": 50, "updated_at": limited["updated_at"]}

        with pytest.raises(FairwayError) as refused:
            client.set_tenant_policy(tenant, burst=0)
        assert (refused.value.status, refused.value.code) == (400, "invalid_policy")
        assert refused.value.message.startswith("burst")
        assert client.tenant_policy(tenant) == limited


def test_async_user_and_tenant_policy(broker: Broker) -> None:
    user, tenant = unique("async-weighted"), unique("async-acme")

    async def scenario() -> None:
        async with AsyncClient(broker.url) as client:
            with pytest.raises(FairwayError) as missing:
                await client.user_policy(user)
            assert (missing.value.status, missing.value.code) == (404, "user_not_found")
            policy = await client.set_user_policy(user, weight=5)
            assert (policy["user"], policy["weight"], policy["max_running"]) == (user, 5, 0)
            assert await client.user_policy(user) == policy
            with pytest.raises(FairwayError) as refused:
                await client.set_user_policy(user, weight=1001)
            assert (refused.value.status, refused.value.code) == (400, "invalid_policy")
            assert refused.value.message.startswith("weight")
            tiered = await client.set_user_policy(user, tier=2)
            assert (tiered["weight"], tiered["tier"]) == (5, 2)
            with pytest.raises(FairwayError) as refused:
                await client.set_user_policy(user, tier=6)
            assert (refused.value.status, refused.value.code) == (400, "invalid_policy")
            assert refused.value.message.startswith("tier: ")

            created = await client.set_tenant_policy(tenant, max_running=4)
            assert (created["tenant"], created["max_running"], created["weight"]) == (tenant, 4, 1)
            changed = await client.set_tenant_policy(tenant, weight=7, tier=1)
            assert (changed["weight"], changed["tier"], changed["max_running"]) == (7, 1, 4)
            assert await client.tenant_policy(tenant) == changed

    asyncio.run(scenario())


# Several brokers: a request moves on past a broker that refuses the connection or answers 503.


class Draining(StandIn):
    """A stand-in for a draining broker: it answers every request 503, and counts them."""

    def __init__(self) -> None:
        self.requests = 0

        def respond(request: BaseHTTPRequestHandler, body: bytes) -> None:
            self.requests += 1
            answer(request, 503, b'{"error":{"code":"shutting_down","message":"draining"}}')

        super().__init__(respond)


def test_a_client_given_several_brokers_moves_past_a_refused_connection(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    away = f"http://127.0.0.1:{free_port()}"
    service = unique("failover")
    given: list[Any] = [[away, broker.url], f"{away},{broker.url}", f" {away}/ , {broker.url}/,"]
    for urls in given:
        with Client(urls) as client:
            assert client.urls == (away, broker.url)
            assert client.url == f"{away},{broker.url}"
            job_id = client.submit(unique("tess"), [service], ["G1"])
            assert client.job(job_id)["job_id"] == job_id
    monkeypatch.setenv("FAIRWAY_URL", f"{away},{broker.url}")
    with Client() as client:
        assert client.ready()

    async def scenario() -> None:
        async with AsyncClient([away, broker.url]) as client:
            assert (await client.job(job_id))["job_id"] == job_id

    asyncio.run(scenario())

    # Past the last broker, its error stands, naming it.
    also_away = f"http://127.0.0.1:{free_port()}"
    with Client([away, also_away]) as client, pytest.raises(FairwayError) as down:
        client.job(job_id)
    assert (down.value.status, down.value.code) == (None, "transport")
    assert also_away in down.value.message
    for wrong in (
        " , ",
        "127.0.0.1:8080",
        f"{broker.url},localhost:8080",
        "http://",
        "http://[::1",
    ):
        with pytest.raises(ValueError, match=r"http://|no broker"):
            Client(wrong)
        monkeypatch.setenv("FAIRWAY_URL", wrong)
        with pytest.raises(ValueError, match=r"http://|no broker"):
            Client()


def test_a_client_moves_past_a_503_and_stays_with_the_broker_that_answered(
    broker: Broker,
) -> None:
    draining = Draining()
    try:
        with Client([draining.url, broker.url]) as client:
            job_id = client.submit(unique("ugo"), [unique("drained")], ["G1"])
            assert draining.requests == 1
            # The broker that answered last is asked first.
            assert client.job(job_id)["job_id"] == job_id
            assert client.ready()
            assert draining.requests == 1
        # Past the last broker, its answer stands.
        away = f"http://127.0.0.1:{free_port()}"
        with Client([away, draining.url]) as client, pytest.raises(FairwayError) as refused:
            client.job(job_id)
        assert (refused.value.status, refused.value.code) == (503, "shutting_down")
    finally:
        draining.close()


def test_an_untrusted_certificate_is_not_a_broker_away(
    tls_broker: TlsBroker, broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    with Client([tls_broker.url, broker.url]) as client, pytest.raises(FairwayError) as refused:
        client.job("00000000-0000-0000-0000-000000000000")
    assert "CERTIFICATE_VERIFY_FAILED" in refused.value.message
