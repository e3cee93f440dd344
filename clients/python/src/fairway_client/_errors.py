"""The one exception the client raises, and the two a handler raises: to fail for good, and
to hand the item back unworked."""

from __future__ import annotations


class FairwayError(Exception):
    """The broker refused a request, or could not be reached.

    ``status`` is the HTTP status (None when no answer came: a transport failure), ``code`` the
    API's error code (``"transport"`` for a transport failure, ``"unexpected_answer"`` for an
    answer that is not the documented document), ``message`` what went wrong, and
    ``retry_after`` the seconds the broker asked to be left alone for (its ``Retry-After``, on
    a 503 or a 429), or None.
    """

    def __init__(
        self, status: int | None, code: str, message: str, retry_after: float | None = None
    ) -> None:
        super().__init__(f"{message} ({status or 'no answer'}, {code})")
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after

    @property
    def is_transient(self) -> bool:
        """Whether asking again later may succeed: no answer, or the broker or its database was
        unavailable (a 5xx)."""
        return self.status is None or self.status >= 500

    def __reduce__(
        self,
    ) -> tuple[type[FairwayError], tuple[int | None, str, str, float | None]]:
        return (type(self), (self.status, self.code, self.message, self.retry_after))


class PermanentError(Exception):
    """Raised by a worker's handler: the item fails for good (``retryable: false``), with this
    exception's text as its error. Any other exception fails the attempt and the broker retries
    the item, up to its ``--max-retries``."""


class Release(Exception):
    """Raised by a worker's handler that cannot work the item now (a full disk, a missing
    mount): the item is handed back unworked (``"status": "released"``), ready again at once
    for any worker (this one too), and the attempt does not count against the job's retry
    budget. ``reason``, if given, is kept on the item for operators (its first 1000
    characters)::

        raise Release("disk full, try elsewhere")
    """

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(*(() if reason is None else (reason,)))
        self.reason = reason
