"""fairway's Python client and worker.

Producers use :class:`Client` (or :class:`AsyncClient`); a service's pods run a
:class:`Worker`. Every refusal of the broker raises :class:`FairwayError`; a handler raises
:class:`PermanentError` to fail an item for good, or :class:`Release` to hand it back unworked.
``fairway-harmony`` (the ``harmony`` extra) runs Harmony service adapters as workers: see
:mod:`fairway_client.harmony`.
"""

from importlib.metadata import version

from ._core import (
    FINISHED_STATUSES,
    Backoff,
    Duration,
    RetryPolicy,
    ServicePolicy,
    TenantPolicy,
    Urls,
    UserPolicy,
    Verify,
)
from ._errors import FairwayError, PermanentError, Release
from .aio import AsyncClient
from .client import Client
from .worker import Succeeded, Worker, default_querier

#: The installed package's version, which is the broker's release it was made with.
__version__ = version("fairway-client")

#: The broker versions this client speaks to (see the README): the API only grows within a
#: major version.
BROKER_VERSIONS = ">=0.1.0,<1.0.0"

__all__ = [
    "BROKER_VERSIONS",
    "FINISHED_STATUSES",
    "AsyncClient",
    "Backoff",
    "Client",
    "Duration",
    "FairwayError",
    "PermanentError",
    "Release",
    "RetryPolicy",
    "ServicePolicy",
    "Succeeded",
    "TenantPolicy",
    "Urls",
    "UserPolicy",
    "Verify",
    "Worker",
    "__version__",
    "default_querier",
]
