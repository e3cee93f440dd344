"""The sample service's adapters, written as harmony-service-lib's own example service is:
download each asset, work on it, ``stage`` the output to the message's staging location.
Nothing here knows about fairway."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from tempfile import mkdtemp
from typing import Any

from harmony_service_lib import BaseHarmonyAdapter, exceptions
from harmony_service_lib.exceptions import NoRetryException
from harmony_service_lib.util import download, generate_output_filename, stage
from pystac import Asset, Catalog, Item


def data_asset(item: Item) -> Asset:
    return next(asset for asset in item.assets.values() if "data" in (asset.roles or []))


class UppercaseAdapter(BaseHarmonyAdapter):  # type: ignore[misc]
    """Rewrites each granule's text in upper case: one output item per input item."""

    def process_item(self, item: Item, source: Any) -> Item:
        result = item.clone()
        result.assets = {}
        workdir = mkdtemp()
        try:
            asset = data_asset(item)
            text = Path(download(asset.href, workdir, logger=self.logger)).read_text()
            if "FAIL" in text:
                raise NoRetryException(f"granule {item.id} cannot be rewritten")
            name = generate_output_filename(asset.href, is_subsetted=True)
            output = Path(workdir) / name
            output.write_text(text.upper())
            url = stage(
                str(output),
                name,
                "text/plain",
                location=self.message.stagingLocation,
                logger=self.logger,
            )
            result.assets["data"] = Asset(url, title=name, media_type="text/plain", roles=["data"])
            return result
        finally:
            shutil.rmtree(workdir)


class ConcatenateAdapter(BaseHarmonyAdapter):  # type: ignore[misc]
    """Aggregates: one output item whose text is every input item's, in catalog order."""

    def invoke(self) -> tuple[Any, Catalog]:
        workdir = mkdtemp()
        try:
            items = list(self.get_all_catalog_items(self.catalog))
            texts = [
                Path(download(data_asset(item).href, workdir, logger=self.logger)).read_text()
                for item in items
            ]
            name = f"concatenated-{len(items)}.txt"
            output = Path(workdir) / name
            output.write_text("\n".join(texts))
            url = stage(
                str(output),
                name,
                "text/plain",
                location=self.message.stagingLocation,
                logger=self.logger,
            )
        finally:
            shutil.rmtree(workdir)
        first = items[0]
        merged = Item(
            id=f"concatenated-{len(items)}",
            geometry=first.geometry,
            bbox=first.bbox,
            datetime=first.datetime,
            properties={"source_items": [item.id for item in items]},
        )
        merged.add_asset("data", Asset(url, title=name, media_type="text/plain", roles=["data"]))
        catalog = Catalog(id="concatenated", description="every input granule, concatenated")
        catalog.add_item(merged)
        return self.message, catalog


def operations_asked(message: Any, source: Any) -> list[str]:
    """Harmony's names of the operations ``message`` asks of this service, in Harmony's order."""
    fmt, subset = message.format, message.subset
    asked = {
        "reproject": bool(fmt and (fmt.crs or fmt.srs)),
        "reformat": bool(fmt and fmt.mime),
        "variableSubset": bool(source and source.variables),
        "spatialSubset": bool(subset and subset.bbox),
        "shapefileSubset": bool(subset and subset.shape),
        "dimensionSubset": bool(subset and subset.dimensions),
        "temporalSubset": bool(
            message.temporal and (message.temporal.start or message.temporal.end)
        ),
    }
    return [name for name, wanted in asked.items() if wanted]


class ExampleAdapter(BaseHarmonyAdapter):  # type: ignore[misc]
    """Works as nasa/harmony-service-example does, on text: downloads each item's data asset
    (with the message's accessToken), does what the message asks (here: notes each operation
    asked on a line of its own), and stages the output under the fixed name Harmony's naming
    gives it (``G1.txt`` becomes ``G1_subsetted.txt``) in the message's ``stagingLocation``. The
    output item's ``operations`` property lists the operations the message asked.

    For the tests, the message's ``extraArgs`` (Harmony's way to pass a service its own
    arguments) may ask it to misbehave, once per invocation: ``sleep`` (seconds, after writing
    its process id to ``pid_file``), ``raise`` (the name of an exception of
    ``harmony_service_lib.exceptions``, or ``RuntimeError``; with ``raise_message``,
    ``raise_category`` for a ``HarmonyException``, and ``raise_times`` with a ``state``
    directory: raise only that many times per granule)."""

    def invoke(self) -> Any:
        extra = self.message.extraArgs
        if extra is not None:
            self.misbehave(extra)
        return super().invoke()

    def misbehave(self, extra: Any) -> None:
        if extra["sleep"]:
            if extra["pid_file"]:
                Path(extra["pid_file"]).write_text(str(os.getpid()))
            time.sleep(float(extra["sleep"]))
        name = extra["raise"]
        if not name:
            return
        if extra["raise_times"] is not None:
            granule = next(iter(self.get_all_catalog_items(self.catalog))).id
            counter = Path(extra["state"]) / f"{granule}-raised"
            raised = int(counter.read_text()) if counter.exists() else 0
            if raised >= int(extra["raise_times"]):
                return
            counter.write_text(str(raised + 1))
        text = extra["raise_message"] or f"{name} from the example service"
        if name == "RuntimeError":
            raise RuntimeError(text)
        exception = getattr(exceptions, name)
        if name == "HarmonyException":
            raise exception(text, extra["raise_category"] or "Service")
        raise exception(text)

    def process_item(self, item: Item, source: Any) -> Item:
        message = self.message
        asked = operations_asked(message, source)
        result = item.clone()
        result.assets = {}
        result.properties["operations"] = asked
        workdir = mkdtemp()
        try:
            asset = data_asset(item)
            text = Path(
                download(asset.href, workdir, logger=self.logger, access_token=message.accessToken)
            ).read_text()
            name = generate_output_filename(
                asset.href,
                variable_subset=source.variables if source else None,
                is_regridded="reproject" in asked,
                is_subsetted="spatialSubset" in asked,
            )
            output = Path(workdir) / name
            output.write_text("\n".join([text, " ".join(asked) or "nothing asked"]))
            mime = (message.format and message.format.mime) or asset.media_type or "text/plain"
            url = stage(
                str(output), name, mime, location=message.stagingLocation, logger=self.logger
            )
            result.assets["data"] = Asset(url, title=name, media_type=mime, roles=["data"])
            return result
        finally:
            shutil.rmtree(workdir)
