"""The asynchronous client: :class:`fairway_client.Client`'s methods as coroutines, for asyncio
programs. The listings (``results``, ``items``, ``jobs``, ...) are async iterators."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any

import httpx

from . import _core
from ._core import (
    Call,
    RetryPolicy,
    ServicePolicy,
    Step,
    Strategy,
    TenantPolicy,
    Urls,
    UserPolicy,
    Verify,
)


class AsyncClient:
    """An asyncio client of the broker at ``url``, or of several brokers; see
    :class:`fairway_client.Client`, whose ``url`` (a URL, a comma-separated string or a list:
    a request moves to the next broker while one refuses the connection or answers 503),
    ``token``, ``timeout``, ``verify`` and ``http`` (here an ``httpx.AsyncClient``) it takes.

    ``async with AsyncClient(...) as client:`` closes its connections at the end.
    """

    def __init__(
        self,
        url: Urls | None = None,
        token: str | None = None,
        *,
        timeout: float = _core.REQUEST_TIMEOUT,
        verify: Verify = True,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        _core.check_verify(verify, http)
        #: The brokers' base URLs, in the order given.
        self.urls = _core.resolve_urls(url)
        #: The brokers' base URLs, comma-separated (one URL for one broker).
        self.url = ",".join(self.urls)
        self._brokers = _core.Brokers(self.urls)
        self._token = _core.resolve_token(token)
        self._http = http or httpx.AsyncClient(timeout=timeout, verify=_core.ssl_verify(verify))
        self._owns_http = http is None

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncClient({self.url!r})"

    async def _send(self, call: Call) -> httpx.Response:
        """Sends ``call`` to the brokers, as :class:`fairway_client._core.Route` says."""
        kwargs = _core.request_kwargs(call, self._token)
        route = self._brokers.route(call)
        while True:
            outcome: httpx.Response | httpx.HTTPError
            try:
                outcome = await self._http.request(call.method, route.url, **kwargs)
            except httpx.HTTPError as error:
                outcome = error
            response = route.settle(outcome)
            if response is not None:
                return response

    async def _call(self, call: Call) -> Any:
        return _core.decode(await self._send(call))

    # Producers.

    async def submit(
        self,
        user: str,
        steps: Sequence[Step],
        items: Iterable[Any],
        *,
        is_async: bool | None = None,
        tenant: str | None = None,
        actor: Sequence[str] | None = None,
        priority: int | None = None,
        metadata: Mapping[str, str | int] | None = None,
        component: str | None = None,
        retry: RetryPolicy | None = None,
        not_before: datetime | None = None,
        idempotency_key: str | None = None,
    ) -> str:
        """Submits a job and returns its id; see :meth:`fairway_client.Client.submit`, whose
        options, ``retry``, ``not_before`` and ``idempotency_key`` included, it takes."""
        call = _core.submit_call(
            user,
            steps,
            items,
            is_async=is_async,
            tenant=tenant,
            actor=actor,
            priority=priority,
            metadata=metadata,
            component=component,
            retry=retry,
            not_before=not_before,
            idempotency_key=idempotency_key,
        )
        return str((await self._call(call))["job_id"])

    async def submit_raw(
        self, body: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call(_core.submit_raw_call(body, idempotency_key))
        return answer

    async def add_items(
        self, job_id: str, items: Iterable[Any], *, component: str | None = None
    ) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call(_core.add_items_call(job_id, items, component))
        return answer

    async def job(self, job_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call(Call("GET", _core.job_path(job_id)))
        return answer

    async def wait(self, job_id: str, timeout: float = 600.0) -> dict[str, Any]:
        """The job once it has finished; raises :class:`TimeoutError` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            wait = int(min(max(left, 0.0), _core.MAX_WAIT))
            job: dict[str, Any] = await self._call(_core.wait_call(job_id, wait))
            if job.get("status") in _core.FINISHED_STATUSES:
                return job
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"job {job_id} has not finished after {timeout:g} s: {job.get('status')}"
                )
            if left < 1:
                await asyncio.sleep(left)

    async def results_pages(
        self, job_id: str, *, page_size: int | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        cursor: str | None = None
        while True:
            params = _core.page_params(page_size, cursor)
            page: dict[str, Any] = await self._call(
                Call("GET", _core.job_path(job_id, "/results"), params)
            )
            yield page
            cursor = _core.next_cursor(page)
            if cursor is None:
                return

    async def results(self, job_id: str, *, page_size: int | None = None) -> AsyncIterator[Any]:
        async for page in self.results_pages(job_id, page_size=page_size):
            for result in page.get("results", []):
                yield result

    async def errors(
        self, job_id: str, *, page_size: int | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        async for page in self.results_pages(job_id, page_size=page_size):
            for error in page.get("errors", []):
                yield error

    async def items(
        self,
        job_id: str,
        status: str | None = None,
        *,
        step: int | None = None,
        page_size: int | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        cursor: str | None = None
        while True:
            params = _core.page_params(page_size, cursor, status=status, step=step)
            page = await self._call(Call("GET", _core.job_path(job_id, "/items"), params))
            for item in page.get("items", []):
                yield item
            cursor = _core.next_cursor(page)
            if cursor is None:
                return

    async def jobs(
        self,
        user: str | None = None,
        *,
        tenant: str | None = None,
        status: str | None = None,
        page_size: int | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        cursor: str | None = None
        while True:
            params = _core.page_params(page_size, cursor, user=user, tenant=tenant, status=status)
            page = await self._call(Call("GET", "/jobs", params))
            for job in page.get("jobs", []):
                yield job
            cursor = _core.next_cursor(page)
            if cursor is None:
                return

    async def pause(self, job_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call(Call("POST", _core.job_path(job_id, "/pause")))
        return answer

    async def resume(self, job_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call(Call("POST", _core.job_path(job_id, "/resume")))
        return answer

    async def cancel(self, job_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call(Call("POST", _core.job_path(job_id, "/cancel")))
        return answer

    # Workers.

    async def claim(
        self,
        service: str,
        querier: str,
        *,
        worker: int = 0,
        max: int = 1,
        wait: float = 0,
        strategy: Strategy | None = None,
    ) -> list[dict[str, Any]]:
        answer = await self._claim_answer(
            service, querier, worker=worker, max=max, wait=wait, strategy=strategy
        )
        return answer.items

    async def _claim_answer(
        self,
        service: str,
        querier: str,
        *,
        worker: int,
        max: int,
        wait: float,
        strategy: Strategy | None,
    ) -> _core.Claimed:
        """:meth:`claim`, saying too whether the broker knows the service (the worker's)."""
        call = _core.claim_call(
            service, querier, worker=worker, max=max, wait=wait, strategy=strategy
        )
        return _core.claimed(await self._send(call))

    async def report(self, item_id: int, body: Mapping[str, Any]) -> dict[str, Any]:
        answer: dict[str, Any] = await self._call(_core.report_call(item_id, body))
        return answer

    async def heartbeat(self, item_id: int, attempt: int) -> dict[str, Any]:
        return await self.report(item_id, _core.running(attempt))

    async def succeed(
        self,
        item_id: int,
        attempt: int,
        results: Sequence[Any],
        *,
        component: str | None = None,
        warning: str | None = None,
    ) -> dict[str, Any]:
        body = _core.successful(attempt, results, component, warning=warning)
        return await self.report(item_id, body)

    async def fail(
        self, item_id: int, attempt: int, error: str | None, *, retryable: bool = True
    ) -> dict[str, Any]:
        return await self.report(item_id, _core.failed(attempt, error, retryable))

    async def release(
        self, item_id: int, attempt: int, reason: str | None = None
    ) -> dict[str, Any]:
        return await self.report(item_id, _core.released(attempt, reason))

    async def shutdown_querier(self, querier: str) -> None:
        await self._call(_core.querier_shutdown_call(querier))

    # Operators.

    async def service_policy(self, service: str) -> ServicePolicy:
        """See :meth:`fairway_client.Client.service_policy`."""
        answer: ServicePolicy = await self._call(_core.service_policy_call(service))
        return answer

    async def set_service_policy(
        self,
        service: str,
        *,
        max_running: int | None = None,
        rate_per_second: float | None = None,
        burst: int | None = None,
    ) -> ServicePolicy:
        """See :meth:`fairway_client.Client.set_service_policy`."""
        call = _core.set_service_policy_call(
            service, max_running=max_running, rate_per_second=rate_per_second, burst=burst
        )
        answer: ServicePolicy = await self._call(call)
        return answer

    async def user_policy(self, user: str) -> UserPolicy:
        """See :meth:`fairway_client.Client.user_policy`."""
        answer: UserPolicy = await self._call(_core.user_policy_call(user))
        return answer

    async def set_user_policy(
        self,
        user: str,
        *,
        weight: int | None = None,
        tier: int | None = None,
        max_running: int | None = None,
        rate_per_second: float | None = None,
        burst: int | None = None,
    ) -> UserPolicy:
        """See :meth:`fairway_client.Client.set_user_policy`."""
        call = _core.set_user_policy_call(
            user,
            weight=weight,
            tier=tier,
            max_running=max_running,
            rate_per_second=rate_per_second,
            burst=burst,
        )
        answer: UserPolicy = await self._call(call)
        return answer

    async def tenant_policy(self, tenant: str) -> TenantPolicy:
        """See :meth:`fairway_client.Client.tenant_policy`."""
        answer: TenantPolicy = await self._call(_core.tenant_policy_call(tenant))
        return answer

    async def set_tenant_policy(
        self,
        tenant: str,
        *,
        weight: int | None = None,
        tier: int | None = None,
        max_running: int | None = None,
        rate_per_second: float | None = None,
        burst: int | None = None,
        max_queriers: int | None = None,
        max_outstanding: int | None = None,
    ) -> TenantPolicy:
        """See :meth:`fairway_client.Client.set_tenant_policy`."""
        call = _core.set_tenant_policy_call(
            tenant,
            weight=weight,
            tier=tier,
            max_running=max_running,
            rate_per_second=rate_per_second,
            burst=burst,
            max_queriers=max_queriers,
            max_outstanding=max_outstanding,
        )
        answer: TenantPolicy = await self._call(call)
        return answer

    # Probes.

    async def ready(self) -> bool:
        try:
            await self._call(Call("GET", "/readyz"))
        except Exception:
            return False
        return True
