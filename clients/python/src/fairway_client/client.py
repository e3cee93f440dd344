"""The synchronous client: producers' calls (submit, wait, read back, steer), the worker API
underneath :class:`fairway_client.Worker` (claim, report), and operators' policies on services,
users and tenants."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
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


class Client:
    """A client of the broker at ``url``, or of several brokers.

    ``url`` is a broker's base URL, several as a comma-separated string
    (``"http://a:8080,http://b:8080"``) or a list of them; it defaults to ``FAIRWAY_URL`` (the
    same), then ``http://127.0.0.1:8080``. Given several, a request goes to the broker that
    answered last, and on to the next while one refuses the connection or answers 503
    (draining, or its database away: the broker changed nothing, so sending again is safe);
    past the last broker tried, its answer or error stands. ``token`` (sent as a bearer token)
    defaults to ``FAIRWAY_TOKEN``. Every refusal raises :class:`fairway_client.FairwayError`
    with the HTTP status, the API's error code and its message; a broker that cannot be reached
    raises it with ``status`` None. Safe to share between threads; close it (or use it as a
    context manager) to free its connections.

    ``verify`` checks an ``https://`` broker's certificate: True (the default) against the
    default trust store (``SSL_CERT_FILE`` or ``SSL_CERT_DIR`` when set), a path against the CA
    certificates in that file or directory only (a private CA), an :class:`ssl.SSLContext` as
    it says, False not at all. ``http`` is an ``httpx.Client`` to send requests with instead of
    the client's own (``timeout`` and ``verify`` are then that client's business).
    """

    def __init__(
        self,
        url: Urls | None = None,
        token: str | None = None,
        *,
        timeout: float = _core.REQUEST_TIMEOUT,
        verify: Verify = True,
        http: httpx.Client | None = None,
    ) -> None:
        _core.check_verify(verify, http)
        #: The brokers' base URLs, in the order given.
        self.urls = _core.resolve_urls(url)
        #: The brokers' base URLs, comma-separated (one URL for one broker).
        self.url = ",".join(self.urls)
        self._brokers = _core.Brokers(self.urls)
        self._token = _core.resolve_token(token)
        self._http = http or httpx.Client(timeout=timeout, verify=_core.ssl_verify(verify))
        self._owns_http = http is None

    def close(self) -> None:
        if self._owns_http:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    def _send(self, call: Call) -> httpx.Response:
        """Sends ``call`` to the brokers, as :class:`fairway_client._core.Route` says."""
        kwargs = _core.request_kwargs(call, self._token)
        route = self._brokers.route(call)
        while True:
            outcome: httpx.Response | httpx.HTTPError
            try:
                outcome = self._http.request(call.method, route.url, **kwargs)
            except httpx.HTTPError as error:
                outcome = error
            response = route.settle(outcome)
            if response is not None:
                return response

    def _call(self, call: Call) -> Any:
        return _core.decode(self._send(call))

    # Producers.

    def submit(
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
        """Submits a job and returns its id.

        ``steps`` are services' names or ``{"service": ..., "aggregate": True}``; ``items`` are
        the first step's payloads (any JSON), each made an item (of ``component``, when given).
        Options left None take the broker's defaults (``is_async`` true, tenant ``default``).

        ``retry`` is how the job's items are retried: ``{"max_attempts", "backoff", "initial",
        "max"}``, any of them (see :class:`fairway_client.RetryPolicy`); delays are seconds, a
        ``timedelta`` or text such as ``"2s"``. ``not_before`` is a timezone-aware datetime
        before which no item is handed out (they wait as ``scheduled``); a naive one raises
        ``ValueError``.

        ``idempotency_key`` (1 to 255 printable ASCII characters) makes the submission safe to
        send again, after a timeout or a transport error: the same key with the same job
        answers the first job's id and creates nothing, for the broker's
        ``--idempotency-ttl``; the same key with another job raises ``FairwayError`` 409
        ``idempotency_key_reused``. "The same job" includes ``not_before``: compute it once.
        """
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
        return str(self._call(call)["job_id"])

    def submit_raw(
        self, body: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Submits a ``POST /jobs`` body as it is; returns the answer, ``{"job_id", "status"}``.
        ``idempotency_key`` is sent as the ``Idempotency-Key`` header, as :meth:`submit` does."""
        answer: dict[str, Any] = self._call(_core.submit_raw_call(body, idempotency_key))
        return answer

    def add_items(
        self, job_id: str, items: Iterable[Any], *, component: str | None = None
    ) -> dict[str, Any]:
        """Adds payloads as items of the first step of an unfinished job; returns the job."""
        answer: dict[str, Any] = self._call(_core.add_items_call(job_id, items, component))
        return answer

    def job(self, job_id: str) -> dict[str, Any]:
        """The job as ``GET /jobs/{id}`` gives it: status, progress, steps, metadata."""
        answer: dict[str, Any] = self._call(Call("GET", _core.job_path(job_id)))
        return answer

    def wait(self, job_id: str, timeout: float = 600.0) -> dict[str, Any]:
        """The job once it has finished (``successful``, ``complete_with_errors``, ``failed``
        or ``canceled``), asking with ``?wait=`` as often as needed (60 s at most each time).

        Raises the built-in :class:`TimeoutError` if it has not finished after ``timeout``
        seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            wait = int(min(max(left, 0.0), _core.MAX_WAIT))
            job: dict[str, Any] = self._call(_core.wait_call(job_id, wait))
            if job.get("status") in _core.FINISHED_STATUSES:
                return job
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"job {job_id} has not finished after {timeout:g} s: {job.get('status')}"
                )
            if left < 1:
                time.sleep(left)

    def results_pages(
        self, job_id: str, *, page_size: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """Each page of ``GET /jobs/{id}/results`` in turn (``results``, ``errors``,
        ``finished``, ...), following the cursor while ``more`` is true."""
        cursor: str | None = None
        while True:
            params = _core.page_params(page_size, cursor)
            page: dict[str, Any] = self._call(
                Call("GET", _core.job_path(job_id, "/results"), params)
            )
            yield page
            cursor = _core.next_cursor(page)
            if cursor is None:
                return

    def results(self, job_id: str, *, page_size: int | None = None) -> Iterator[Any]:
        """Every result of the job's last step, in item order, across all pages. While the job
        runs, the results that exist so far."""
        for page in self.results_pages(job_id, page_size=page_size):
            yield from page.get("results", [])

    def errors(self, job_id: str, *, page_size: int | None = None) -> Iterator[dict[str, Any]]:
        """``{"id", "step", "attempt", "error"}`` of every item that failed for good."""
        for page in self.results_pages(job_id, page_size=page_size):
            yield from page.get("errors", [])

    def items(
        self,
        job_id: str,
        status: str | None = None,
        *,
        step: int | None = None,
        page_size: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """Every item of the job in the order they were made, across all pages, optionally of
        one ``status`` (``ready``, ``scheduled``, ``running``, ``successful``, ``failed``,
        ``canceled``) and one ``step``."""
        cursor: str | None = None
        while True:
            params = _core.page_params(page_size, cursor, status=status, step=step)
            page = self._call(Call("GET", _core.job_path(job_id, "/items"), params))
            yield from page.get("items", [])
            cursor = _core.next_cursor(page)
            if cursor is None:
                return

    def jobs(
        self,
        user: str | None = None,
        *,
        tenant: str | None = None,
        status: str | None = None,
        page_size: int | None = None,
    ) -> Iterator[dict[str, Any]]:
        """A user's jobs (in one tenant, with ``tenant``), or a tenant's, newest first."""
        cursor: str | None = None
        while True:
            params = _core.page_params(page_size, cursor, user=user, tenant=tenant, status=status)
            page = self._call(Call("GET", "/jobs", params))
            yield from page.get("jobs", [])
            cursor = _core.next_cursor(page)
            if cursor is None:
                return

    def pause(self, job_id: str) -> dict[str, Any]:
        """Pauses the job (its running items finish); returns it as it is now."""
        answer: dict[str, Any] = self._call(Call("POST", _core.job_path(job_id, "/pause")))
        return answer

    def resume(self, job_id: str) -> dict[str, Any]:
        answer: dict[str, Any] = self._call(Call("POST", _core.job_path(job_id, "/resume")))
        return answer

    def cancel(self, job_id: str) -> dict[str, Any]:
        """Cancels every unfinished item of the job; returns it as it is now."""
        answer: dict[str, Any] = self._call(Call("POST", _core.job_path(job_id, "/cancel")))
        return answer

    # Workers.

    def claim(
        self,
        service: str,
        querier: str,
        *,
        worker: int = 0,
        max: int = 1,
        wait: float = 0,
        strategy: Strategy | None = None,
    ) -> list[dict[str, Any]]:
        """Claims up to ``max`` items of ``service``, waiting up to ``wait`` seconds (at most 60)
        for work to appear; an empty list when none came."""
        call = _core.claim_call(
            service, querier, worker=worker, max=max, wait=wait, strategy=strategy
        )
        answer = self._call(call)
        return list(answer["work_items"]) if answer else []

    def report(self, item_id: int, body: Mapping[str, Any]) -> dict[str, Any]:
        """Posts a status update (``{"status", "attempt", ...}``); returns ``{"id", "status"}``.
        Sending the same update again is safe: the broker answers a repeat as it answered the
        first."""
        answer: dict[str, Any] = self._call(_core.report_call(item_id, body))
        return answer

    def heartbeat(self, item_id: int, attempt: int) -> dict[str, Any]:
        """Extends the lease of the attempt held."""
        return self.report(item_id, _core.running(attempt))

    def succeed(
        self,
        item_id: int,
        attempt: int,
        results: Sequence[Any],
        *,
        component: str | None = None,
        warning: str | None = None,
    ) -> dict[str, Any]:
        body = _core.successful(attempt, results, component, warning=warning)
        return self.report(item_id, body)

    def fail(
        self, item_id: int, attempt: int, error: str | None, *, retryable: bool = True
    ) -> dict[str, Any]:
        return self.report(item_id, _core.failed(attempt, error, retryable))

    def release(self, item_id: int, attempt: int, reason: str | None = None) -> dict[str, Any]:
        """Hands the item back unworked: it is ready again at once, and the attempt does not
        count against the job's retry budget. ``reason`` (at most 1000 characters) is kept on
        the item as its ``release_reason``."""
        return self.report(item_id, _core.released(attempt, reason))

    def shutdown_querier(self, querier: str) -> None:
        """Tells the broker that ``querier`` is leaving: it gets no more work."""
        self._call(_core.querier_shutdown_call(querier))

    # Operators.

    def service_policy(self, service: str) -> ServicePolicy:
        """The service's policy (``max_running``, ``rate_per_second``, ``burst``) and its items
        running now. Raises ``FairwayError`` 404 ``service_not_found`` for a service that no job
        names and that has no policy."""
        answer: ServicePolicy = self._call(_core.service_policy_call(service))
        return answer

    def set_service_policy(
        self,
        service: str,
        *,
        max_running: int | None = None,
        rate_per_second: float | None = None,
        burst: int | None = None,
    ) -> ServicePolicy:
        """Changes the fields given of the service's policy, for a service no job has named yet
        too, and returns the policy as it is now; those left None keep their value.
        ``max_running`` 0 lifts the cap, ``rate_per_second`` 0 the rate limit; ``burst`` is at
        least 1. A bad value raises ``FairwayError`` 400 ``invalid_policy``, its message
        starting with the field's name, and changes nothing."""
        call = _core.set_service_policy_call(
            service, max_running=max_running, rate_per_second=rate_per_second, burst=burst
        )
        answer: ServicePolicy = self._call(call)
        return answer

    def user_policy(self, user: str) -> UserPolicy:
        """The user's policy (``weight``, ``tier``, ``max_running``, ``rate_per_second``,
        ``burst``), its items running now over every service, whether it is at its cap and,
        while its rate limit holds it back, when its next item is due. Raises
        ``FairwayError`` 404 ``user_not_found`` for a user with neither work nor a policy."""
        answer: UserPolicy = self._call(_core.user_policy_call(user))
        return answer

    def set_user_policy(
        self,
        user: str,
        *,
        weight: int | None = None,
        tier: int | None = None,
        max_running: int | None = None,
        rate_per_second: float | None = None,
        burst: int | None = None,
    ) -> UserPolicy:
        """Changes the fields given of the user's policy, for a user not yet seen too, and
        returns the policy as it is now; those left None keep their value. ``weight`` (1 to
        1000; 1 by default) is the user's share of the workers against other users with work
        waiting; ``tier`` (1 to 5; 3 by default) is an operator's priority above that share,
        the user's work served before that of a higher tier in its tenant; ``max_running``
        caps the user's items running at once over every service (0 lifts the cap),
        ``rate_per_second`` limits how fast they are handed out (0 lifts the limit),
        ``burst`` (at least 1) is how many go out at once after a quiet spell. A bad value
        raises ``FairwayError`` 400 ``invalid_policy``, its message starting with the
        field's name, and changes nothing."""
        call = _core.set_user_policy_call(
            user,
            weight=weight,
            tier=tier,
            max_running=max_running,
            rate_per_second=rate_per_second,
            burst=burst,
        )
        answer: UserPolicy = self._call(call)
        return answer

    def tenant_policy(self, tenant: str) -> TenantPolicy:
        """The tenant's limits (``max_queriers``, ``max_outstanding``), its policy
        (``weight``, ``tier``, ``max_running``, ``rate_per_second``, ``burst``) and what it
        holds now: its items running and waiting, whether it is at its cap, when its next
        item is due while its rate limit holds it back, and the queriers that serve it.
        Raises ``FairwayError`` 404 ``tenant_not_found`` for a tenant that does not exist."""
        answer: TenantPolicy = self._call(_core.tenant_policy_call(tenant))
        return answer

    def set_tenant_policy(
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
        """Changes the fields given of the tenant's limits and policy, creating the tenant if
        needed, and returns it as it is now; those left None keep their value. ``weight`` (1
        to 1000; 1 by default) is the tenant's share of the workers against other tenants',
        ``tier`` (1 to 5; 3 by default) its priority above that share, as a user's is, and
        ``max_running``, ``rate_per_second`` and ``burst`` cap and rate-limit its items over
        every user and service, as :meth:`set_user_policy`'s do a user's (0 lifts each).
        ``max_queriers`` is how many queriers serve the tenant (0: all; the shards are
        redrawn), ``max_outstanding`` how many ready items it may have waiting (0: no limit).
        A bad value raises ``FairwayError`` 400 ``invalid_policy``, its message starting with
        the field's name, and changes nothing."""
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
        answer: TenantPolicy = self._call(call)
        return answer

    # Probes.

    def ready(self) -> bool:
        """Whether the broker answers and reaches its database."""
        try:
            self._call(Call("GET", "/readyz"))
        except Exception:
            return False
        return True
