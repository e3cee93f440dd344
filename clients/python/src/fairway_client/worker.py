"""A worker for one service: it long-polls the broker, runs a handler per item while it
heartbeats the item's lease, and reports how each item ended, keeping each report until a
broker takes it. It does what ``fairway worker`` (the Rust command) does, with a Python function
in place of a command."""

from __future__ import annotations

import asyncio
import contextlib
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
import warnings
from collections import deque
from collections.abc import Awaitable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from types import FrameType
from typing import Any, Callable, Union

import httpx

from . import _core
from ._core import Strategy, Urls, Verify
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

#: The longest pause between two tries of a report: a report is small, and the sooner it lands
#: after a broker is back, the sooner its job goes on. The first pause is ``FIRST_BACKOFF``.
LONGEST_REPORT_PAUSE = 2.0

#: How long a stopped worker goes on delivering its reports (and finishing the items it holds)
#: unless told otherwise: a little under the 120 s grace period of the example Deployment.
STOP_TIMEOUT = 110.0

#: Retries of the querier's shutdown the broker did not answer, before giving up on it.
LEAVE_RETRIES = 4

#: How many of the items that stopped being the worker's before their reports landed its last
#: line names (it counts them all).
GIVEN_UP_NAMED = 20

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


def backoff_pause(failures: int, longest: float = LONGEST_BACKOFF) -> float:
    """The pause after ``failures`` + 1 failures in a row: ``FIRST_BACKOFF`` doubled at each
    failure, plus up to as much again at random, and at most ``longest``."""
    pause = min(FIRST_BACKOFF * 2.0 ** min(failures, 16), longest)
    return min(pause * (1 + random.random()), longest)


def _utc_text(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Held:
    """An item the worker took and has not reported yet, and what it knows of its lease."""

    def __init__(self, item: Mapping[str, Any]) -> None:
        self.item_id = int(item["id"])
        self.attempt = int(item["attempt"])
        expires = item.get("lease_expires_at")
        #: When its lease ends, as far as the worker knows: the claim's, then each heartbeat's
        #: (None: the claim did not say).
        self.lease_ends = parse_timestamp(expires) if isinstance(expires, str) else None
        #: How long the claim leased it for, for a broker whose heartbeat answers do not say.
        self.lease: timedelta | None = None
        if self.lease_ends is not None:
            self.lease = max(self.lease_ends - datetime.now(timezone.utc), timedelta(0))
        #: Whether its handler has ended, and its report waits for a broker.
        self.reporting = False

    def extended(self, answer: Mapping[str, Any]) -> None:
        """A heartbeat went through: the lease ends when its answer says, or (from a broker
        whose answer does not say) a whole lease from now at the earliest."""
        said = answer.get("lease_expires_at")
        until = parse_timestamp(said) if isinstance(said, str) else None
        if until is None and self.lease is not None:
            until = datetime.now(timezone.utc) + self.lease
            if self.lease_ends is not None:
                until = max(until, self.lease_ends)
        if until is not None:
            self.lease_ends = until

    def left(self) -> float | None:
        """Seconds until the lease ends (0 once it has), or None if the worker cannot tell."""
        if self.lease_ends is None:
            return None
        return max((self.lease_ends - datetime.now(timezone.utc)).total_seconds(), 0.0)

    def unreported(self) -> dict[str, Any]:
        ends = None if self.lease_ends is None else _utc_text(self.lease_ends)
        return {
            "id": self.item_id,
            "attempt": self.attempt,
            "lease_expires_at": ends,
            "working": not self.reporting,
        }


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

    ``url`` is the broker's base URL, or several brokers' as a comma-separated string or a list
    (default: ``FAIRWAY_URL``, which may be a comma-separated list too). Each request goes to
    the broker that answered last, and on to the next while one refuses the connection or
    answers 503, as :class:`~fairway_client.Client`'s do: given every broker, a worker carries
    on while one of them stops, restarts or is gone for good.

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
    item up, cancelling an async handler.

    A finished item's report is kept until a broker takes it. While none answers it (a broker
    stopped or restarting, a dropped connection, a 5xx, a 429) it is sent again after a pause
    from 0.5 s doubling to 2 s with jitter, never shorter than the broker's ``Retry-After``
    (the broker answers an identical repeat as it answered the first), and the heartbeats go
    on meanwhile, so that the lease outlives a broker away for minutes and no work is done
    twice. The worker lets a report go only when a broker refuses it (a 4xx such as 409: the
    attempt is no longer the worker's, as the job was canceled or the lease ran out and the
    item went to another worker), or when the item's lease has ended with no broker having
    taken it (the broker then hands the item to another worker). It knows when a lease ends
    from the claim and from each heartbeat's answer (``lease_expires_at``; from a broker whose
    answer does not say, a whole lease, as long as the claim's, from the heartbeat). A
    heartbeat refused while a report waits only stops the heartbeats: the report, sent again,
    says whether it landed.

    A work request the broker cannot answer (503, 429, no connection) is sent again after a
    pause, 0.5 s doubling to 30 s with jitter and never shorter than the broker's
    ``Retry-After``; the pause is shared by the slots, and one slot at a time asks a failing
    broker whether it is back.

    ``run()`` blocks until the worker stops: on SIGTERM or SIGINT (when run in the main thread
    with ``handle_signals``), or :meth:`stop` from any thread. It then starts no more work
    requests and shuts its querier down (``POST /queriers/{querier}/shutdown``), which ends its
    waiting long polls at the broker; it works and reports whatever they still bring and the
    items it holds, and returns. After ``stop_timeout`` seconds (110 by default: keep it a
    little under the pod's termination grace period) it returns anyway, and :attr:`unreported`
    lists the items it could not report, each to run again once its lease ends. Its last line
    of log says which: ``stopped: every item taken was reported``, or each item that was not
    and why. ``querier`` defaults to the host name and the process id (for
    the process's first worker without one; ``-2``, ``-3``, ... is added for the next ones, since
    a querier shut down is refused work for a while); ``strategy`` (a leaf's name or an
    expression) is passed to every claim. ``verify`` checks an ``https://`` broker's
    certificate, as :class:`~fairway_client.Client`'s does (a path: a private CA's).

    ``report_retry_for`` is deprecated and no longer used: a report is kept until a broker
    takes it or its lease ends.
    """

    def __init__(
        self,
        url: Urls | None = None,
        *,
        service: str,
        handler: Handler,
        concurrency: int = 1,
        querier: str | None = None,
        token: str | None = None,
        strategy: Strategy | None = None,
        wait: float = 20.0,
        heartbeat: float | None = None,
        report_retry_for: float | None = None,
        handle_signals: bool = True,
        verify: Verify = True,
        stop_timeout: float = STOP_TIMEOUT,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if not 0 <= wait <= _core.MAX_WAIT:
            raise ValueError(f"wait must be between 0 and {_core.MAX_WAIT} seconds")
        if heartbeat is not None and heartbeat <= 0:
            raise ValueError("heartbeat must be positive")
        if not 0 <= stop_timeout < float("inf"):
            raise ValueError("stop_timeout must be a number of seconds, 0 or more")
        if report_retry_for is not None:
            warnings.warn(
                "report_retry_for is no longer used: a report is kept until a broker takes it "
                "or its item's lease ends",
                DeprecationWarning,
                stacklevel=2,
            )
        #: The brokers' base URLs, in the order given.
        self.urls = _core.resolve_urls(url)
        #: The brokers' base URLs, comma-separated (one URL for one broker).
        self.url = ",".join(self.urls)
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
        self.stop_timeout = float(stop_timeout)
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
        self._unavailable: _Unavailable | None = None
        self._warned_unknown_service = False
        #: The items taken and not yet reported (nor let go), by id and attempt.
        self._held: dict[tuple[int, int], _Held] = {}
        #: Handlers running in threads, which outlive an item given up.
        self._threads: set[Future[Any]] = set()
        self._taken = 0
        #: Items that stopped being the worker's before a report of theirs landed: how many,
        #: and the latest in words.
        self._given_up = 0
        self._given_up_named: deque[str] = deque(maxlen=GIVEN_UP_NAMED)
        self._unreported: list[dict[str, Any]] = []
        #: When the stop timeout ends (time.monotonic()), once the stop has come.
        self._stop_ends: float | None = None

    @property
    def stopping(self) -> bool:
        return self._stop_requested

    @property
    def unreported(self) -> list[dict[str, Any]]:
        """Once :meth:`run` has returned: the items the worker still held when its
        ``stop_timeout`` ran out, unreported, each ``{"id", "attempt", "lease_expires_at",
        "working"}`` (``working``: its handler had not ended; otherwise its report found no
        broker). Each runs again once its lease ends (RFC 3339; None when the claim did not
        say). Empty when the worker stopped in time."""
        return [dict(item) for item in self._unreported]

    def stop(self) -> None:
        """Stops taking work and shuts the querier down; :meth:`run` returns once every item
        held is reported (or no longer the worker's), or after ``stop_timeout``. Safe to call
        from any thread, or from a signal handler, before or during :meth:`run`."""
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
        self._held, self._taken, self._given_up, self._unreported = {}, 0, 0, []
        self._stop_ends = None
        self._given_up_named.clear()
        if self._stop_requested:
            self._stop_event.set()
        limits = httpx.Limits(max_connections=2 * self.concurrency + 4)
        http = httpx.AsyncClient(timeout=_core.REQUEST_TIMEOUT, limits=limits, verify=self._verify)
        client = AsyncClient(self.urls, self._token, http=http)
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
        timed_out = False
        try:
            leave = asyncio.ensure_future(self._leave(client))
            slots = [
                asyncio.ensure_future(self._slot(client, executor, slot))
                for slot in range(self.concurrency)
            ]
            finished = asyncio.ensure_future(self._finish(slots))
            deadline = asyncio.ensure_future(self._stop_deadline())
            try:
                await asyncio.wait({finished, deadline}, return_when=asyncio.FIRST_COMPLETED)
                if finished.done():
                    finished.result()  # a slot's unexpected error, raised
            except BaseException:
                for task in (*slots, finished, leave, deadline):
                    task.cancel()
                raise
            deadline.cancel()
            if not finished.done():
                # The stop came and its time ran out: what is still held goes unreported.
                timed_out = True
                held = sorted(self._held.values(), key=lambda each: each.item_id)
                self._unreported = [each.unreported() for each in held]
                for task in (*slots, finished):
                    task.cancel()
                await asyncio.gather(*slots, finished, return_exceptions=True)
                if self._threads:
                    log.warning(
                        "%d handler(s) of items given up still run in threads; they cannot be "
                        "stopped, and the process ends only once they return",
                        len(self._threads),
                    )
            # Every slot ended, so the stop came, and with it the querier's shutdown: waited
            # for while the stop timeout lasts.
            ends = self._stop_ends
            left = self.stop_timeout if ends is None else ends - time.monotonic()
            try:
                await asyncio.wait_for(leave, max(left, 0.0))
            except asyncio.TimeoutError:
                log.warning(
                    "querier %s: its shutdown got no answer in time (the broker forgets it in "
                    "time)",
                    self.querier,
                )
        finally:
            executor.shutdown(wait=not timed_out, cancel_futures=timed_out)
            await http.aclose()
            self._loop = None
        self._log_stopped()
        if self._fatal is not None:
            raise self._fatal

    async def _finish(self, slots: Sequence[asyncio.Future[None]]) -> None:
        """Ends once every slot has, and every handler left running in a thread (its item
        given up: a thread cannot be stopped) has returned."""
        await asyncio.gather(*slots)
        while self._threads:
            await asyncio.wait([asyncio.wrap_future(each) for each in self._threads.copy()])

    async def _stop_deadline(self) -> None:
        """Ends ``stop_timeout`` after the stop."""
        await self._stopped()
        self._stop_ends = time.monotonic() + self.stop_timeout
        await asyncio.sleep(self.stop_timeout)

    def _log_stopped(self) -> None:
        """The worker's last line: whether every item it took was reported, and if not, which
        were not, and why."""
        unreported = [
            f"item {each['id']} (attempt {each['attempt']}, "
            f"{'still being worked' if each['working'] else 'report waiting for a broker'}, "
            f"lease ends {each['lease_expires_at'] or 'unknown'})"
            for each in self._unreported
        ]
        if not unreported and not self._given_up:
            log.info("stopped: every item taken was reported")
            return
        parts = []
        if unreported:
            parts.append(
                f"{len(unreported)} still held when the stop timeout "
                f"({self.stop_timeout:g} s) ran out, each to run again once its lease ends: "
                + ", ".join(unreported)
            )
        if self._given_up:
            named = "; ".join(self._given_up_named)
            unnamed = self._given_up - len(self._given_up_named)
            if unnamed:
                named += f"; and {unnamed} earlier, each logged as it happened"
            parts.append(f"{self._given_up} no longer this worker's to report: {named}")
        log.log(
            logging.ERROR if unreported else logging.WARNING,
            "stopped: %d of the %d item(s) taken were not reported: %s",
            len(unreported) + self._given_up,
            self._taken,
            "; ".join(parts),
        )

    def _on_signal(self, number: int, frame: FrameType | None) -> None:
        name = signal.Signals(number).name
        if self._stop_requested:
            log.warning("%s: already stopping, finishing %d item(s) held", name, len(self._held))
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
        """Runs the handler on one item, heartbeating while it runs, and delivers its report,
        heartbeating while that waits for a broker."""
        held = _Held(item)
        key = (held.item_id, held.attempt)
        item_id, attempt = key
        self._held[key] = held
        self._taken += 1
        handled: asyncio.Future[dict[str, Any]] | None = None
        beating: asyncio.Future[FairwayError] | None = None
        try:
            log.info("item %d (attempt %d) of job %s: working", item_id, attempt, item["job_id"])
            handled = asyncio.ensure_future(self._handle(executor, item))
            period = heartbeat_period(item.get("lease_expires_at"))
            if self.heartbeat is not None:
                # More often when asked (a cancel then lands sooner), never less often than
                # the lease needs.
                period = min(self.heartbeat, period)
            beating = asyncio.ensure_future(self._heartbeat(client, held, period))
            await asyncio.wait({handled, beating}, return_when=asyncio.FIRST_COMPLETED)
            if not handled.done():
                lost = beating.result()
                log.warning(
                    "item %d (attempt %d): gave up the item, no longer this worker's: %s",
                    item_id,
                    attempt,
                    lost,
                )
                self._let_go(held, f"given up while being worked: {lost}")
                # A coroutine is cancelled; a thread cannot be, and its answer is dropped.
                handled.cancel()
                with contextlib.suppress(BaseException):
                    await handled
                return
            # The heartbeats go on: the lease must outlive a broker away.
            held.reporting = True
            why = await self._deliver(client, held, handled.result())
            if why is not None:
                self._let_go(held, why)
        finally:
            for task in (handled, beating):
                if task is not None and not task.done():
                    task.cancel()
            self._held.pop(key, None)

    def _let_go(self, held: _Held, why: str) -> None:
        """Counts an item that stopped being this worker's before a report of its landed."""
        self._given_up += 1
        self._given_up_named.append(f"item {held.item_id} (attempt {held.attempt}): {why}")

    async def _handle(self, executor: ThreadPoolExecutor, item: dict[str, Any]) -> dict[str, Any]:
        """The handler's verdict on the item, as the report to send."""
        attempt = int(item["attempt"])
        try:
            if self._is_async:
                results: Any = await self.handler(item)  # type: ignore[misc]
            else:
                running = executor.submit(self.handler, item)
                self._threads.add(running)
                running.add_done_callback(self._threads.discard)
                results = await asyncio.wrap_future(running)
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

    async def _heartbeat(self, client: AsyncClient, held: _Held, period: float) -> FairwayError:
        """Extends the lease every ``period`` until the broker says the attempt is no longer
        this worker's (a cancel, or a lease that expired); returns why. Each answer says when
        the lease now ends."""
        while True:
            await asyncio.sleep(period)
            try:
                answer = await client.heartbeat(held.item_id, held.attempt)
            except FairwayError as error:
                if not error.is_transient:
                    if held.reporting:
                        # A report that landed unanswered makes the attempt no longer current
                        # too: the report, sent again, tells which.
                        log.info(
                            "item %d: heartbeat refused while its report waits; no more "
                            "heartbeats: %s",
                            held.item_id,
                            error,
                        )
                    return error
                log.warning("item %d: heartbeat failed, trying again: %s", held.item_id, error)
                continue
            held.extended(answer)

    async def _deliver(
        self, client: AsyncClient, held: _Held, report: Mapping[str, Any]
    ) -> str | None:
        """Sends the report until a broker takes it: None once one has; otherwise why the item
        is no longer this worker's to report. While no broker answers it, it is sent again (the
        broker treats an identical repeat as safe) after a pause from ``FIRST_BACKOFF``
        doubling to ``LONGEST_REPORT_PAUSE`` with jitter, never shorter than a
        ``Retry-After``, and a last time as the item's lease ends."""
        item_id = held.item_id
        failures = 0
        while True:
            try:
                answer = await client.report(item_id, report)
            except FairwayError as error:
                if not (error.is_transient or error.status == 429):
                    replacement = self._replacement(item_id, report, error)
                    if replacement is not None:
                        report, failures = replacement, 0
                        continue
                    log.warning(
                        "item %d (attempt %d): report refused, the attempt is no longer this "
                        "worker's: %s",
                        item_id,
                        held.attempt,
                        error,
                    )
                    return f"report refused: {error}"
                left = held.left()
                if left is not None and left <= 0:
                    log.error(
                        "item %d (attempt %d): no broker took the report before the item's "
                        "lease ended; the item runs again: %s",
                        item_id,
                        held.attempt,
                        error,
                    )
                    ends = "" if held.lease_ends is None else f" at {_utc_text(held.lease_ends)}"
                    return f"no broker took the report before its lease ended{ends}: {error}"
                pause = max(backoff_pause(failures, LONGEST_REPORT_PAUSE), error.retry_after or 0.0)
                if left is not None:
                    pause = min(pause, left)  # a last try as the lease ends
                failures += 1
                log.warning(
                    "item %d: report got no answer; keeping it, sending it again in %.1f s: %s",
                    item_id,
                    pause,
                    error,
                )
                await asyncio.sleep(pause)
                continue
            log.info(
                "item %d (attempt %s): reported %s, now %s",
                item_id,
                report["attempt"],
                report["status"],
                answer.get("status"),
            )
            return None

    @staticmethod
    def _replacement(
        item_id: int, report: Mapping[str, Any], error: FairwayError
    ) -> dict[str, Any] | None:
        """The report to send in place of one the broker refused for what it says, if any."""
        if error.status in (400, 413) and report["status"] == "successful":
            # Results the broker will never take (too large, say): another attempt would make
            # the same, so the item fails for good rather than by its lease.
            log.error("item %d: the broker refused the results: %s", item_id, error)
            refused = f"the broker refused the results: {error.message}"
            return _core.failed(report["attempt"], refused, retryable=False)
        if error.status == 400 and report["status"] == "released" and "reason" in report:
            # A reason the broker will not keep (a NUL character, say): the item goes back all
            # the same, without it.
            log.warning(
                "item %d: the broker refused the release's reason, releasing without: %s",
                item_id,
                error,
            )
            return _core.released(report["attempt"])
        return None


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
