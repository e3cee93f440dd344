"""A worker for one service: it long-polls the broker, runs a handler per item while it
heartbeats the item's lease, and reports how each item ended. It does what ``fairway worker``
(the Rust command) does, with a Python function in place of a command."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import itertools
import json
import logging
import os
import random
import re
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from types import FrameType
from typing import Any, Callable, Union

import httpx

from . import _core
from ._core import Strategy, Verify
from ._errors import FairwayError, PermanentError, Release
from .aio import AsyncClient

log = logging.getLogger("fairway_client.worker")

#: What a handler returns: the item's results, a list of JSON values.
Results = Sequence[Any]


@dataclass(frozen=True)
class Succeeded:
    """What a handler may return in place of its results, to end the item ``successful`` with a
    ``warning`` the broker keeps on the item (``GET /jobs/{id}/items`` shows it): a Harmony
    service that found no data in its granule succeeds with no results and says so."""

    results: Results = ()
    warning: str | None = None


#: A handler: the work item's dict in, its results out; a coroutine function is awaited.
Handler = Callable[
    [dict[str, Any]], Union[Results, Succeeded, Awaitable[Union[Results, Succeeded]]]
]

#: How much of an exception's text becomes the item's error.
ERROR_MAX_CHARS = 4096

#: How much of a :class:`~fairway_client.Release`'s reason is sent (the broker's limit).
REASON_MAX_CHARS = 1000

#: The first pause after the broker could not answer a work request (503, 429, no connection);
#: each failure in a row doubles it, with jitter, up to ``LONGEST_BACKOFF``. A longer
#: ``Retry-After`` from the broker is waited out whole.
FIRST_BACKOFF = 0.5
LONGEST_BACKOFF = 30.0

#: Pause between work requests when ``wait`` is under a second, so that an idle worker with no
#: long poll to wait in does not ask in a tight loop.
EMPTY_POLL_PAUSE = 1.0

#: Retries of the querier's shutdown the broker did not answer, before giving up on it.
LEAVE_RETRIES = 4

#: Bounds of the heartbeat period, whatever lease the claim gave.
MIN_HEARTBEAT = 0.2
MAX_HEARTBEAT = 300.0

#: The heartbeat period when the claim's lease cannot be read.
FALLBACK_HEARTBEAT = 10.0


def default_querier() -> str:
    """The querier name a worker asks as unless told otherwise: the host name (in Kubernetes,
    the pod's name) and the process id, so that each worker process is its own querier."""
    return f"{socket.gethostname()}-{os.getpid()}"


#: Workers made in this process without a querier name, for the default names after the first.
_default_queriers = itertools.count(1)


def backoff_pause(failures: int) -> float:
    """The pause after ``failures`` + 1 failures in a row: ``FIRST_BACKOFF`` doubled at each
    failure, plus up to as much again at random, and at most ``LONGEST_BACKOFF``."""
    pause = min(FIRST_BACKOFF * 2.0 ** min(failures, 16), LONGEST_BACKOFF)
    return min(pause * (1 + random.random()), LONGEST_BACKOFF)


class _Unavailable:
    """When the broker may be asked for work again after it could not answer, shared by the
    worker's slots. While it fails, one slot at a time (the holder of ``probe``) asks whether
    it is back, so that a worker facing a broker that answers nothing but errors sends one
    request per pause, whatever its concurrency."""

    def __init__(self) -> None:
        self.failing = False
        self.until = time.monotonic()
        self.failures = 0
        self.probe = asyncio.Lock()

    def failed(self, retry_after: float | None) -> float:
        """Records that the broker could not answer; returns the pause before the next work
        request. Failures of requests sent before the pause began do not lengthen it."""
        now = time.monotonic()
        self.failing = True
        if now >= self.until:
            self.until = now + max(backoff_pause(self.failures), retry_after or 0.0)
            self.failures += 1
        return self.until - now

    def answered(self) -> None:
        """The broker answered: the next failure starts from the shortest pause."""
        self.failing = False
        self.failures = 0


class Worker:
    """Works items of ``service`` with ``handler``, up to ``concurrency`` at once.

    ``handler(item)`` gets the work item's dict (``id``, ``job_id``, ``step``, ``payload``,
    ``inputs``, ``attempt``, ``user``, ``tenant``, ...) and returns its results, a list of JSON
    values: the item is reported ``successful`` with them (:class:`Succeeded` adds a warning).
    An exception reports it ``failed``
    with ``retryable: true`` and the exception's text as its error;
    :class:`~fairway_client.PermanentError` reports ``retryable: false``;
    :class:`~fairway_client.Release` hands the item back unworked (``released``, with its
    reason), ready again at once and its attempt not counted. A coroutine function is awaited
    on the worker's event loop; any other function runs in a thread of its own.

    While a handler runs, the worker extends the item's lease every half of the lease the
    claim gave (or every ``heartbeat`` seconds when given, and that half when it is shorter);
    once the broker refuses a heartbeat (the job was canceled, the lease ran out), it gives the
    item up, cancelling an async handler. A report that gets no answer (the
    broker restarting, a dropped connection, a 5xx) is sent again for up to
    ``report_retry_for`` seconds: the broker answers an identical repeat as it answered the
    first.

    A work request the broker cannot answer (503, 429, no connection) is sent again after a
    pause, 0.5 s doubling to 30 s with jitter and never shorter than the broker's
    ``Retry-After``; the pause is shared by the slots, and one slot at a time asks a failing
    broker whether it is back.

    ``run()`` blocks until the worker stops: on SIGTERM or SIGINT (when run in the main thread
    with ``handle_signals``), or :meth:`stop` from any thread. It then starts no more work
    requests and shuts its querier down (``POST /queriers/{querier}/shutdown``), which ends its
    waiting long polls at the broker; it works and reports whatever they still bring and the
    items it holds, and returns. ``querier`` defaults to the host name and the process id (for
    the process's first worker without one; ``-2``, ``-3``, ... is added for the next ones, since
    a querier shut down is refused work for a while); ``strategy`` (a leaf's name or an
    expression) is passed to every claim. ``verify`` checks an ``https://`` broker's
    certificate, as :class:`~fairway_client.Client`'s does (a path: a private CA's).
    """

    def __init__(
        self,
        url: str | None = None,
        *,
        service: str,
        handler: Handler,
        concurrency: int = 1,
        querier: str | None = None,
        token: str | None = None,
        strategy: Strategy | None = None,
        wait: float = 20.0,
        heartbeat: float | None = None,
        report_retry_for: float = 30.0,
        handle_signals: bool = True,
        verify: Verify = True,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not 0 <= wait <= _core.MAX_WAIT:
            raise ValueError(f"wait must be between 0 and {_core.MAX_WAIT} seconds")
        if heartbeat is not None and heartbeat <= 0:
            raise ValueError("heartbeat must be positive")
        self.url = _core.resolve_url(url)
        self.service = service
        self.handler = handler
        self.concurrency = concurrency
        if not querier:
            made = next(_default_queriers)
            querier = default_querier() + (f"-{made}" if made > 1 else "")
        self.querier = querier
        self.strategy = strategy
        self.wait = wait
        self.heartbeat = heartbeat
        self.report_retry_for = report_retry_for
        self.handle_signals = handle_signals
        self._token = token
        # Made here, so that a CA file that cannot be read fails the constructor, not run().
        self._verify = _core.ssl_verify(verify)
        self._is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None)  # noqa: B004 - a callable object's method
        )
        self._stop_requested = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop_event: asyncio.Event | None = None
        self._fatal: FairwayError | None = None
        self._held = 0
        self._unavailable: _Unavailable | None = None
        self._warned_unknown_service = False

    @property
    def stopping(self) -> bool:
        return self._stop_requested

    def stop(self) -> None:
        """Stops taking work and shuts the querier down; :meth:`run` returns once every item
        held is reported. Safe to call from any thread, or from a signal handler, before or
        during :meth:`run`."""
        self._stop_requested = True
        loop, event = self._loop, self._stop_event
        if loop is not None and event is not None:
            with contextlib.suppress(RuntimeError):  # the loop has closed: run() has returned
                loop.call_soon_threadsafe(event.set)

    def run(self) -> None:
        """Works until stopped (see the class). Raises :class:`FairwayError` if the broker
        refused the worker's claims for good (a bad strategy, a token not allowed), once the
        items it held are reported."""
        signals = self.handle_signals and threading.current_thread() is threading.main_thread()
        previous: dict[signal.Signals, Any] = {}
        if signals:
            for number in (signal.SIGTERM, signal.SIGINT):
                previous[number] = signal.getsignal(number)
                signal.signal(number, self._on_signal)
        try:
            asyncio.run(self.run_async())
        finally:
            for number, handler in previous.items():
                signal.signal(number, handler)

    async def run_async(self) -> None:
        """:meth:`run` for a program that has its own event loop (it installs no signal
        handler: call :meth:`stop`)."""
        self._loop = asyncio.get_running_loop()
        self._stop_event = asyncio.Event()
        self._unavailable = _Unavailable()
        if self._stop_requested:
            self._stop_event.set()
        limits = httpx.Limits(max_connections=2 * self.concurrency + 4)
        http = httpx.AsyncClient(timeout=_core.REQUEST_TIMEOUT, limits=limits, verify=self._verify)
        client = AsyncClient(self.url, self._token, http=http)
        executor = ThreadPoolExecutor(
            max_workers=self.concurrency, thread_name_prefix=f"fairway-{self.service}"
        )
        log.info(
            "working %s as querier %s, %d at a time, at %s",
            self.service,
            self.querier,
            self.concurrency,
            self.url,
        )
        try:
            leave = asyncio.ensure_future(self._leave(client))
            slots = [
                asyncio.ensure_future(self._slot(client, executor, slot))
                for slot in range(self.concurrency)
            ]
            try:
                await asyncio.gather(*slots)
            except BaseException:
                for task in (*slots, leave):
                    task.cancel()
                raise
            # Every slot ended, so the stop came, and with it the querier's shutdown.
            await leave
        finally:
            executor.shutdown(wait=True)
            await http.aclose()
            self._loop = None
        log.info("stopped: every item taken was reported")
        if self._fatal is not None:
            raise self._fatal

    def _on_signal(self, number: int, frame: FrameType | None) -> None:
        name = signal.Signals(number).name
        if self._stop_requested:
            log.warning("%s: already stopping, finishing %d item(s) held", name, self._held)
        else:
            log.info("%s: stopping; no more work is taken; finishing the items held", name)
        self.stop()

    async def _stopped(self) -> None:
        assert self._stop_event is not None
        await self._stop_event.wait()

    async def _sleep_unless_stopped(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stopped(), seconds)

    async def _leave(self, client: AsyncClient) -> None:
        """Once the worker stops, shuts its querier down: the broker ends the querier's waiting
        work requests (their slots see 410), hands it no more work, and takes it out of its
        tenants' shards once it holds no lease, so that no shard waits on a worker gone."""
        await self._stopped()
        failures = 0
        while True:
            try:
                await client.shutdown_querier(self.querier)
            except FairwayError as error:
                if error.status == 404:
                    return  # never seen by the broker: nothing to leave
                if (error.is_transient or error.status == 429) and failures < LEAVE_RETRIES:
                    await asyncio.sleep(max(backoff_pause(failures), error.retry_after or 0.0))
                    failures += 1
                    continue
                log.warning(
                    "cannot shut querier %s down (the broker forgets it in time): %s",
                    self.querier,
                    error,
                )
                return
            log.info("querier %s shut down", self.querier)
            return

    async def _slot(self, client: AsyncClient, executor: ThreadPoolExecutor, slot: int) -> None:
        """One slot: claims an item, works it, reports it, until told to stop. A work request
        under way when the stop comes is not abandoned, since the broker may have leased an
        item for it already: the querier's shutdown ends it, and whatever it brings is worked
        and reported."""
        unavailable = self._unavailable
        assert unavailable is not None
        while not self._stop_requested:
            # While the broker fails, one slot at a time asks it whether it is back.
            probe: asyncio.Lock | None = unavailable.probe if unavailable.failing else None
            if probe is not None:
                await probe.acquire()
                if not unavailable.failing:  # it answered another slot meanwhile
                    probe.release()
                    probe = None
            try:
                pause = unavailable.until - time.monotonic()
                if pause > 0:
                    await self._sleep_unless_stopped(pause)
                if self._stop_requested:
                    break
                try:
                    claimed = await client._claim_answer(
                        self.service,
                        self.querier,
                        worker=slot % 1024,
                        max=1,
                        wait=self.wait,
                        strategy=self.strategy,
                    )
                except FairwayError as error:
                    if not self._claim_failed(error):
                        break
                    continue
            finally:
                if probe is not None:
                    probe.release()
            unavailable.answered()
            if claimed.unknown_service and not self._warned_unknown_service:
                self._warned_unknown_service = True
                log.warning(
                    "the broker says no job has named this service, %s: check its name; "
                    "waiting for work all the same",
                    self.service,
                )
            for item in claimed.items:
                await self._work(client, executor, item)
            if not claimed.items and self.wait < 1:
                # No long poll to wait in: pause rather than ask the broker in a tight loop.
                await self._sleep_unless_stopped(EMPTY_POLL_PAUSE)

    def _claim_failed(self, error: FairwayError) -> bool:
        """Deals with a work request that failed; whether the slot asks again."""
        if error.status == 410:
            if not self._stop_requested:
                # Not this worker's own shutdown: an operator's.
                log.warning("the broker is shutting this querier down: %s", error)
                self.stop()
            return False
        if error.is_transient or error.status == 429:
            if self._stop_requested:
                return False
            assert self._unavailable is not None
            pause = self._unavailable.failed(error.retry_after)
            log.warning("asking for work failed; asking again in %.1f s: %s", pause, error)
            return True
        log.error("the broker refused this worker's claims: %s", error)
        self._fatal = self._fatal or error
        self.stop()
        return False

    async def _work(
        self, client: AsyncClient, executor: ThreadPoolExecutor, item: dict[str, Any]
    ) -> None:
        """Runs the handler on one item, heartbeating while it runs, and reports how it ended."""
        item_id, attempt = int(item["id"]), int(item["attempt"])
        self._held += 1
        try:
            log.info("item %d (attempt %d) of job %s: working", item_id, attempt, item["job_id"])
            handled = asyncio.ensure_future(self._handle(executor, item))
            period = heartbeat_period(item.get("lease_expires_at"))
            if self.heartbeat is not None:
                # More often when asked (a cancel then lands sooner), never less often than
                # the lease needs.
                period = min(self.heartbeat, period)
            beating = asyncio.ensure_future(self._heartbeat(client, item_id, attempt, period))
            await asyncio.wait({handled, beating}, return_when=asyncio.FIRST_COMPLETED)
            if not handled.done():
                lost = beating.result()
                log.warning(
                    "item %d (attempt %d): gave up the item, no longer this worker's: %s",
                    item_id,
                    attempt,
                    lost,
                )
                # A coroutine is cancelled; a thread cannot be, and its answer is dropped.
                handled.cancel()
                with contextlib.suppress(BaseException):
                    await handled
                return
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating
            await self._report(client, item_id, handled.result())
        finally:
            self._held -= 1

    async def _handle(self, executor: ThreadPoolExecutor, item: dict[str, Any]) -> dict[str, Any]:
        """The handler's verdict on the item, as the report to send."""
        attempt = int(item["attempt"])
        try:
            if self._is_async:
                results: Any = await self.handler(item)  # type: ignore[misc]
            else:
                loop = asyncio.get_running_loop()
                results = await loop.run_in_executor(
                    executor, functools.partial(self.handler, item)
                )
                if inspect.isawaitable(results):
                    results = await results
        except Release as release:
            reason = release_reason(release)
            log.info("item %s handed back: %s", item["id"], reason or "no reason given")
            return _core.released(attempt, reason)
        except PermanentError as error:
            log.warning("item %s failed for good: %s", item["id"], error_text(error))
            return _core.failed(attempt, error_text(error), retryable=False)
        except Exception as error:
            log.warning("item %s failed: %s", item["id"], error_text(error), exc_info=True)
            return _core.failed(attempt, error_text(error), retryable=True)
        warning: str | None = None
        if isinstance(results, Succeeded):
            results, warning = results.results, results.warning
            if warning is not None:
                warning = str(warning)[:ERROR_MAX_CHARS]
                log.warning("item %s succeeded with a warning: %s", item["id"], warning)
        if not isinstance(results, (list, tuple)):
            problem = f"the handler returned {type(results).__name__}, not a list of results"
            log.error("item %s: %s", item["id"], problem)
            return _core.failed(attempt, problem, retryable=False)
        try:
            # As strict as the request's encoder: NaN and infinities are not JSON either.
            json.dumps(results, allow_nan=False)
        except (TypeError, ValueError) as error:
            problem = f"the handler's results are not JSON: {error}"
            log.error("item %s: %s", item["id"], problem)
            return _core.failed(attempt, problem, retryable=False)
        return _core.successful(attempt, results, warning=warning)

    async def _heartbeat(
        self, client: AsyncClient, item_id: int, attempt: int, period: float
    ) -> FairwayError:
        """Extends the lease every ``period`` until the broker says the attempt is no longer
        this worker's (a cancel, or a lease that expired); returns why."""
        while True:
            await asyncio.sleep(period)
            try:
                await client.heartbeat(item_id, attempt)
            except FairwayError as error:
                if not error.is_transient:
                    return error
                log.warning("item %d: heartbeat failed, trying again: %s", item_id, error)

    async def _report(self, client: AsyncClient, item_id: int, report: Mapping[str, Any]) -> None:
        """Sends the report, again while no answer comes (the broker treats an identical
        repeat as safe), for up to ``report_retry_for`` seconds."""
        deadline = time.monotonic() + self.report_retry_for
        pause = 0.25
        while True:
            try:
                answer = await client.report(item_id, report)
            except FairwayError as error:
                wait = max(pause, error.retry_after or 0.0)
                if error.is_transient and time.monotonic() + wait < deadline:
                    log.warning(
                        "item %d: report got no answer, sending it again: %s", item_id, error
                    )
                    await asyncio.sleep(wait)
                    pause = min(pause * 2, 4.0)
                    continue
                if error.status == 409:
                    log.warning(
                        "item %d: report refused, the attempt has ended: %s", item_id, error
                    )
                elif error.status in (400, 413) and report["status"] == "successful":
                    # Results the broker will never take (too large, say): another attempt
                    # would make the same, so the item fails for good rather than by its lease.
                    log.error("item %d: the broker refused the results: %s", item_id, error)
                    refused = f"the broker refused the results: {error.message}"
                    await self._report(
                        client, item_id, _core.failed(report["attempt"], refused, retryable=False)
                    )
                elif error.status == 400 and report["status"] == "released" and "reason" in report:
                    # A reason the broker will not keep (a NUL character, say): the item goes
                    # back all the same, without it.
                    log.warning(
                        "item %d: the broker refused the release's reason, releasing without: %s",
                        item_id,
                        error,
                    )
                    await self._report(client, item_id, _core.released(report["attempt"]))
                else:
                    log.error(
                        "item %d: report failed; the lease will return the item: %s",
                        item_id,
                        error,
                    )
                return
            log.info(
                "item %d (attempt %s): reported %s, now %s",
                item_id,
                report["attempt"],
                report["status"],
                answer.get("status"),
            )
            return


def error_text(error: BaseException) -> str:
    text = str(error) or type(error).__name__
    return text[:ERROR_MAX_CHARS]


def release_reason(release: Release) -> str | None:
    """The reason a release sends: the one given, as text, within the broker's limit."""
    if release.reason is None:
        return None
    return str(release.reason)[:REASON_MAX_CHARS]


_TIMESTAMP = re.compile(
    r"^(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:?\d\d)?$", re.IGNORECASE
)


def parse_timestamp(text: str) -> datetime | None:
    """An RFC 3339 timestamp as the broker writes it (nanoseconds, ``Z``), on Python 3.9 too."""
    match = _TIMESTAMP.match(text.strip())
    if match is None:
        return None
    day, clock, fraction, offset = match.groups()
    micros = (fraction or "0")[:6].ljust(6, "0")
    zone = "+00:00" if offset is None or offset.upper() == "Z" else offset
    if len(zone) == 5:
        zone = zone[:3] + ":" + zone[3:]
    try:
        return datetime.fromisoformat(f"{day}T{clock}.{micros}{zone}")
    except ValueError:
        return None


def heartbeat_period(lease_expires_at: str | None) -> float:
    """Half of the lease the claim gave, within sane bounds."""
    expires = parse_timestamp(lease_expires_at) if lease_expires_at else None
    if expires is None:
        return FALLBACK_HEARTBEAT
    left = (expires - datetime.now(timezone.utc)).total_seconds()
    return min(max(left / 2, MIN_HEARTBEAT), MAX_HEARTBEAT)
