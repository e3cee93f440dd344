"""What the synchronous and the asynchronous client share: the requests each method makes, and
how an answer becomes a document or a :class:`FairwayError`. No I/O here."""

from __future__ import annotations

import json
import math
import os
import ssl
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Literal, TypedDict, Union
from urllib.parse import quote

import httpx

from ._errors import FairwayError

DEFAULT_URL = "http://127.0.0.1:8080"

#: Longer than any long poll the broker holds (60 s), so that a wait ends at the broker.
REQUEST_TIMEOUT = 75.0

#: The most a single ``?wait=`` may ask, in seconds.
MAX_WAIT = 60

#: A job in one of these has finished: nothing more happens to it.
FINISHED_STATUSES = frozenset({"successful", "complete_with_errors", "failed", "canceled"})

#: A claim strategy: a leaf's bare name (``"oldest"``) or an expression
#: (``{"select_only": {...}}``), as the README's "Claim strategies" describes.
Strategy = Union[str, Mapping[str, Any]]

#: A step: a service's name, or ``{"service": ..., "aggregate": ...}`` as ``POST /jobs`` takes it.
Step = Union[str, Mapping[str, Any]]

#: How the delay before a retry grows: not at all (ready at once), ``initial`` each time, or
#: ``initial`` doubled after each failure up to ``max``, with jitter.
Backoff = Literal["none", "fixed", "exponential"]

#: A delay: seconds, a :class:`~datetime.timedelta`, or the broker's own text (``"2s"``,
#: ``"10m"``, ``"1h 30m"``).
Duration = Union[float, timedelta, str]


class RetryPolicy(TypedDict, total=False):
    """A job's ``retry`` policy, as ``POST /jobs`` takes it; every key is optional, and those
    left out take the broker's defaults (``--retry-backoff``, ``--retry-initial``,
    ``--retry-max``; ``--max-retries`` + 1 attempts)."""

    #: Attempts each item gets, the first included: 1 to 100.
    max_attempts: int
    backoff: Backoff
    #: The first retry's delay (every retry's, under ``fixed``); at most 7 days.
    initial: Duration
    #: The longest delay ``exponential`` grows to; at most 7 days.
    max: Duration


class ServicePolicy(TypedDict):
    """A service's policy and its items running now, as ``GET`` and ``PUT
    /admin/services/{service}`` answer."""

    service: str
    #: Most of the service's items running at once, over every broker; 0: no cap.
    max_running: int
    #: Items handed out per second, over every broker; 0: no limit.
    rate_per_second: float
    #: Items handed out at once after a quiet spell: at most ``burst + rate_per_second * t``
    #: in any t seconds.
    burst: int
    #: The service's items running now.
    running: int


class _Policy(TypedDict):
    """What users and tenants share: a weight, a tier, a cap and a rate limit, and what they
    hold."""

    #: The key's share of the workers against the others at its level (users of a tenant,
    #: tenants of a component): 1 (the default) to 1000. Of two with work waiting, one of
    #: weight 2 holds about twice the running items of one of weight 1.
    weight: int
    #: Its tier, 1 to 5 (3 by default), granted by an operator above fairness: at its level,
    #: work of a lower tier is served first, and weights share the workers within a tier.
    tier: int
    #: Most of its items running at once, over every broker and service; 0: no cap.
    max_running: int
    #: Its items handed out per second, over every broker; 0: no limit.
    rate_per_second: float
    #: Items handed out at once after a quiet spell: at most ``burst + rate_per_second * t``
    #: in any t seconds.
    burst: int
    #: Its items running now, over every service.
    running: int
    #: Whether it is at its cap: claims pass it over until one of its items ends.
    at_cap: bool
    #: While its rate limit holds it back, when its next item is due (RFC 3339); None
    #: otherwise.
    throttled_until: str | None


class UserPolicy(_Policy):
    """A user's policy and its items running now, as ``GET`` and ``PUT /admin/users/{user}``
    answer."""

    user: str


class TenantPolicy(_Policy):
    """A tenant's limits, its policy and what it holds now, as ``GET`` and ``PUT
    /admin/tenants/{tenant}`` answer."""

    tenant: str
    #: Queriers that serve the tenant; 0: all of them.
    max_queriers: int
    #: Most ready items the tenant may have waiting; 0: no limit. A submission past it raises
    #: ``FairwayError`` 429 ``too_many_outstanding``.
    max_outstanding: int
    #: Whether only ``queriers`` serve it (False: every querier does).
    sharded: bool
    #: The tenant's ready items waiting.
    outstanding: int
    #: The queriers that serve it now.
    queriers: list[str]
    #: When the tenant was created and last changed (RFC 3339).
    created_at: str
    updated_at: str


#: What ``verify=`` takes: True (the default trust store, or ``SSL_CERT_FILE``), False (no
#: check), the path of a CA bundle or of a directory of CA certificates, or an SSL context.
Verify = Union[bool, str, os.PathLike[str], ssl.SSLContext]


#: What ``url=`` takes: one broker's base URL, several as a comma-separated string
#: (``"http://a:8080,http://b:8080"``), or a list of them.
Urls = Union[str, Sequence[str]]


def resolve_urls(url: Urls | None) -> tuple[str, ...]:
    """The brokers' base URLs: ``url``, else ``FAIRWAY_URL``, else ``http://127.0.0.1:8080``;
    each a URL, a comma-separated list of them, or (``url`` only) a list."""
    chosen: Urls = url or os.environ.get("FAIRWAY_URL") or DEFAULT_URL
    given = [chosen] if isinstance(chosen, str) else list(chosen)
    bases: list[str] = []
    for each in given:
        if not isinstance(each, str):
            raise TypeError(f"a broker's URL is a string, not {type(each).__name__}")
        for part in each.split(","):
            base = part.strip().rstrip("/")
            if not base:
                continue  # "a,b," or "a, ,b": nothing between the commas
            # Caught here: httpx would take "localhost:8080" for a URL of scheme "localhost"
            # and fail every request as a transport error, which a worker retries for ever.
            try:
                host = httpx.URL(base).host if base.startswith(("http://", "https://")) else ""
            except httpx.InvalidURL:
                host = ""
            if not host:
                raise ValueError(
                    f"the broker's URL must start with http:// or https:// and name a host, "
                    f"not {part.strip()!r}"
                )
            bases.append(base)
    if not bases:
        raise ValueError(f"no broker's URL in {chosen!r}")
    return tuple(bases)


def resolve_token(token: str | None) -> str | None:
    """The bearer token: ``token``, else ``FAIRWAY_TOKEN``, else none."""
    return token or os.environ.get("FAIRWAY_TOKEN") or None


def ssl_verify(verify: Verify) -> bool | ssl.SSLContext:
    """httpx's ``verify`` for ``verify``: a path becomes an SSL context that trusts the CA
    certificates there (and only those), since httpx 0.28 deprecates a path."""
    if isinstance(verify, (bool, ssl.SSLContext)):
        return verify
    path = os.fspath(verify)
    if os.path.isdir(path):
        return ssl.create_default_context(capath=path)
    return ssl.create_default_context(cafile=path)


def check_verify(verify: Verify, http: object | None) -> None:
    if http is not None and verify is not True:
        raise ValueError(
            "verify= applies to connections the client opens; set it on the http= client"
        )


def headers(token: str | None) -> dict[str, str]:
    result = {"accept": "application/json", "user-agent": "fairway-client-python"}
    if token:
        result["authorization"] = f"Bearer {token}"
    return result


@dataclass(frozen=True)
class Call:
    """One request: its method, path, query and JSON body (None: no body)."""

    method: str
    path: str
    params: dict[str, str] = field(default_factory=dict)
    body: Any = None
    #: Seconds to wait for the answer, when longer than the client's timeout (a long poll).
    timeout: float | None = None
    #: Request headers besides the client's own.
    headers: dict[str, str] = field(default_factory=dict)


def retry_after(response: httpx.Response) -> float | None:
    """The seconds an answer's ``Retry-After`` asks to wait (the broker never sends a date)."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def decode(response: httpx.Response) -> Any:
    """The JSON document of a successful answer (None for 204), or the broker's error raised."""
    status = response.status_code
    if status == 204:
        return None
    text = response.text
    if 200 <= status < 300:
        try:
            return json.loads(text) if text else None
        except ValueError:
            raise FairwayError(
                status, "unexpected_answer", f"the broker's answer is not JSON: {text[:200]}"
            ) from None
    wait = retry_after(response)
    try:
        error = json.loads(text)["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        reason = response.reason_phrase or "error"
        raise FairwayError(
            status, "unexpected_answer", f"{reason}: {text[:200]}".rstrip(": "), wait
        ) from None
    raise FairwayError(status, code, message, wait)


def request_kwargs(call: Call, token: str | None) -> dict[str, Any]:
    """httpx's keyword arguments for ``call``, but its method and URL."""
    kwargs: dict[str, Any] = {"params": call.params, "headers": {**headers(token), **call.headers}}
    if call.body is not None:
        kwargs["json"] = call.body
    if call.timeout is not None:
        kwargs["timeout"] = call.timeout
    return kwargs


def transport_error(error: httpx.HTTPError, call: Call, base: str | None = None) -> FairwayError:
    """A request that got no answer, as a :class:`FairwayError` of status None; ``base`` names
    the broker when the client has several."""
    detail = str(error) or type(error).__name__
    where = f"{base}{call.path}" if base is not None else call.path
    return FairwayError(None, "transport", f"{call.method} {where}: {detail}")


def untrusted_certificate(error: BaseException) -> bool:
    """Whether ``error`` comes of a broker's certificate that failed verification."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def broker_away(error: httpx.HTTPError) -> bool:
    """Whether a request that failed with ``error`` never reached a broker (the connection was
    refused, or never made), so that another broker may be sent it. A certificate that fails
    verification is not a broker away: it says what to fix, and goes no further."""
    connect = isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout))
    return connect and not untrusted_certificate(error)


#: A broker's answer that it changed nothing and another broker may answer: 503 (it drains, or
#: cannot reach its database).
UNAVAILABLE = 503


class Brokers:
    """The brokers a client sends to, in the order given, and the one it sends to now: the
    last that answered. A request that finds its broker away (a refused connection, or a 503,
    which changes nothing, so that sending it again is safe) goes on to the next, each broker
    once; the answer or error of the last one tried stands. Shared by every request of one
    client, from any thread."""

    def __init__(self, bases: Sequence[str]) -> None:
        if not bases:
            raise ValueError("no broker to send to")
        self.bases = tuple(bases)
        #: The index of the broker requests go to first.
        self.current = 0

    def route(self, call: Call) -> Route:
        return Route(self, call)


class Route:
    """One call's way through the brokers. The client sends the call to :attr:`url` and gives
    :meth:`settle` what came of it, until :meth:`settle` answers the response to keep (or
    raises the transport error that stands)::

        route = brokers.route(call)
        while True:
            try:
                outcome = http.request(call.method, route.url, ...)
            except httpx.HTTPError as error:
                outcome = error
            response = route.settle(outcome)
            if response is not None:
                return response
    """

    def __init__(self, brokers: Brokers, call: Call) -> None:
        self._brokers = brokers
        self._call = call
        first, count = brokers.current, len(brokers.bases)
        self._order = [(first + step) % count for step in range(count)]
        self._tried = 0

    @property
    def base(self) -> str:
        """The base URL of the broker the call goes to now."""
        return self._brokers.bases[self._order[self._tried]]

    @property
    def url(self) -> str:
        return self.base + self._call.path

    def settle(self, outcome: httpx.Response | httpx.HTTPError) -> httpx.Response | None:
        """The response that answers the call; None when the call goes on to the next broker
        (:attr:`url` now names it). Raises the call's :class:`FairwayError` when no answer
        came and no broker is left to try, or the failure is not one of a broker away."""
        index = self._order[self._tried]
        last = self._tried + 1 == len(self._order)
        if isinstance(outcome, httpx.Response):
            if outcome.status_code == UNAVAILABLE and not last:
                self._tried += 1
                return None
            self._brokers.current = index
            return outcome
        if broker_away(outcome) and not last:
            self._tried += 1
            return None
        several = len(self._order) > 1
        raise transport_error(outcome, self._call, self.base if several else None) from outcome


def job_path(job_id: str, suffix: str = "") -> str:
    return f"/jobs/{quote(str(job_id), safe='')}{suffix}"


def policy_body(**fields: float | None) -> dict[str, float]:
    # Only the fields given: the broker keeps the value of every field left out.
    return {key: value for key, value in fields.items() if value is not None}


def service_policy_call(service: str) -> Call:
    return Call("GET", f"/admin/services/{quote(service, safe='')}")


def set_service_policy_call(
    service: str,
    *,
    max_running: int | None,
    rate_per_second: float | None,
    burst: int | None,
) -> Call:
    body = policy_body(max_running=max_running, rate_per_second=rate_per_second, burst=burst)
    return Call("PUT", f"/admin/services/{quote(service, safe='')}", body=body)


def user_policy_call(user: str) -> Call:
    return Call("GET", f"/admin/users/{quote(user, safe='')}")


def set_user_policy_call(
    user: str,
    *,
    weight: int | None,
    tier: int | None,
    max_running: int | None,
    rate_per_second: float | None,
    burst: int | None,
) -> Call:
    body = policy_body(
        weight=weight,
        tier=tier,
        max_running=max_running,
        rate_per_second=rate_per_second,
        burst=burst,
    )
    return Call("PUT", f"/admin/users/{quote(user, safe='')}", body=body)


def tenant_policy_call(tenant: str) -> Call:
    return Call("GET", f"/admin/tenants/{quote(tenant, safe='')}")


def set_tenant_policy_call(
    tenant: str,
    *,
    weight: int | None,
    tier: int | None,
    max_running: int | None,
    rate_per_second: float | None,
    burst: int | None,
    max_queriers: int | None,
    max_outstanding: int | None,
) -> Call:
    body = policy_body(
        weight=weight,
        tier=tier,
        max_running=max_running,
        rate_per_second=rate_per_second,
        burst=burst,
        max_queriers=max_queriers,
        max_outstanding=max_outstanding,
    )
    return Call("PUT", f"/admin/tenants/{quote(tenant, safe='')}", body=body)


def querier_shutdown_call(querier: str) -> Call:
    return Call("POST", f"/queriers/{quote(querier, safe='')}/shutdown")


def step_body(step: Step) -> dict[str, Any]:
    if isinstance(step, str):
        return {"service": step}
    return dict(step)


def item_bodies(items: Iterable[Any], component: str | None) -> list[dict[str, Any]]:
    bodies = []
    for payload in items:
        body: dict[str, Any] = {"payload": payload}
        if component is not None:
            body["component"] = component
        bodies.append(body)
    return bodies


def duration_text(value: Duration, key: str) -> str:
    """A delay as the broker reads it: whole seconds, else milliseconds, else microseconds (the
    broker takes no fractions)."""
    if isinstance(value, str):
        return value
    if isinstance(value, timedelta):
        micros = value // timedelta(microseconds=1)
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        micros = round(value * 1_000_000)
    else:
        raise TypeError(f"retry[{key!r}] is seconds, a timedelta or a text such as '2s': {value!r}")
    if micros < 0:
        raise ValueError(f"retry[{key!r}] must not be negative: {value!r}")
    if micros % 1_000_000 == 0:
        return f"{micros // 1_000_000}s"
    if micros % 1_000 == 0:
        return f"{micros // 1_000}ms"
    return f"{micros}us"


def retry_body(retry: Mapping[str, Any]) -> dict[str, Any]:
    # Other keys go as they are: the broker names any it does not know.
    return {
        key: duration_text(value, key) if key in ("initial", "max") else value
        for key, value in retry.items()
    }


def not_before_text(not_before: datetime) -> str:
    """An aware datetime as RFC 3339 in UTC. A naive one is refused rather than guessed: the
    local zone and UTC would both be plausible, and hours apart."""
    if not isinstance(not_before, datetime):
        raise TypeError(f"not_before is a datetime, not {type(not_before).__name__}")
    if not_before.utcoffset() is None:
        raise ValueError(
            "not_before must be timezone-aware, such as "
            "datetime.now(timezone.utc) + timedelta(minutes=5); "
            f"{not_before.isoformat()} has no time zone"
        )
    text = not_before.astimezone(timezone.utc).isoformat()
    return text[: -len("+00:00")] + "Z"


def idempotency_headers(key: str | None) -> dict[str, str]:
    if key is None:
        return {}
    # Checked here: httpx would fail on some of these before sending, as a transport error
    # that looks worth retrying.
    if not (1 <= len(key) <= 255 and all(" " <= char <= "~" for char in key)):
        raise ValueError(
            f"idempotency_key must be 1 to 255 printable ASCII characters, not {key!r:.80}"
        )
    return {"idempotency-key": key}


def submit_raw_call(body: Mapping[str, Any], idempotency_key: str | None) -> Call:
    return Call("POST", "/jobs", body=dict(body), headers=idempotency_headers(idempotency_key))


def submit_call(
    user: str,
    steps: Sequence[Step],
    items: Iterable[Any],
    *,
    is_async: bool | None,
    tenant: str | None,
    actor: Sequence[str] | None,
    priority: int | None,
    metadata: Mapping[str, str | int] | None,
    component: str | None,
    retry: RetryPolicy | None = None,
    not_before: datetime | None = None,
    idempotency_key: str | None = None,
) -> Call:
    if isinstance(steps, str):
        raise TypeError("steps is a list of steps: write steps=[...]")
    body: dict[str, Any] = {
        "user": user,
        "steps": [step_body(step) for step in steps],
        "items": item_bodies(items, component),
    }
    options: dict[str, Any] = {
        "is_async": is_async,
        "tenant": tenant,
        "actor": list(actor) if actor is not None else None,
        "priority": priority,
        "metadata": dict(metadata) if metadata is not None else None,
        "retry": retry_body(retry) if retry is not None else None,
        "not_before": not_before_text(not_before) if not_before is not None else None,
    }
    body.update({key: value for key, value in options.items() if value is not None})
    return submit_raw_call(body, idempotency_key)


def add_items_call(job_id: str, items: Iterable[Any], component: str | None) -> Call:
    return Call("POST", job_path(job_id, "/items"), body={"items": item_bodies(items, component)})


def wait_call(job_id: str, wait: int) -> Call:
    return Call("GET", job_path(job_id), {"wait": str(wait)}, timeout=wait + 15.0)


def page_params(
    page_size: int | None, cursor: str | None, **filters: object | None
) -> dict[str, str]:
    params = {key: str(value) for key, value in filters.items() if value is not None}
    if page_size is not None:
        params["limit"] = str(page_size)
    if cursor is not None:
        params["cursor"] = cursor
    return params


def next_cursor(page: Mapping[str, Any]) -> str | None:
    """The cursor of the next page, or None when this page was the last."""
    if not page.get("more"):
        return None
    cursor = page.get("next_cursor")
    return str(cursor) if cursor is not None else None


def strategy_param(strategy: Strategy) -> str:
    if isinstance(strategy, str):
        return strategy
    return json.dumps(strategy, separators=(",", ":"))


def claim_call(
    service: str,
    querier: str,
    *,
    worker: int,
    max: int,
    wait: float,
    strategy: Strategy | None,
) -> Call:
    if wait < 0:
        raise ValueError("wait must not be negative")
    seconds = int(min(wait, MAX_WAIT))
    params = {
        "service": service,
        "querier": querier,
        "worker": str(worker),
        "max": str(max),
        "wait": str(seconds),
    }
    if strategy is not None:
        params["strategy"] = strategy_param(strategy)
    return Call("GET", "/work", params, timeout=seconds + 15.0)


#: The header of an empty claim's answer when no job has named the service.
UNKNOWN_SERVICE_HEADER = "fairway-unknown-service"


@dataclass(frozen=True)
class Claimed:
    """What a claim got: its items, and whether the broker knows the service at all."""

    items: list[dict[str, Any]]
    #: No item came, and no job has named the service: a typo in its name, or an early start.
    unknown_service: bool = False


def claimed(response: httpx.Response) -> Claimed:
    answer = decode(response)
    if not answer:
        return Claimed([], UNKNOWN_SERVICE_HEADER in response.headers)
    return Claimed(list(answer["work_items"]))


def report_call(item_id: int, body: Mapping[str, Any]) -> Call:
    return Call("POST", f"/work/{item_id}/status", body=dict(body))


def successful(
    attempt: int,
    results: Sequence[Any],
    component: str | None = None,
    *,
    warning: str | None = None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"status": "successful", "attempt": attempt, "results": list(results)}
    if component is not None:
        body["component"] = component
    if warning is not None:
        body["warning"] = warning
    return body


def failed(attempt: int, error: str | None, retryable: bool = True) -> dict[str, Any]:
    return {"status": "failed", "attempt": attempt, "error": error, "retryable": retryable}


def released(attempt: int, reason: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"status": "released", "attempt": attempt}
    if reason is not None:
        body["reason"] = reason
    return body


def running(attempt: int) -> dict[str, Any]:
    return {"status": "running", "attempt": attempt}
