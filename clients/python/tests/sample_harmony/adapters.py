"""The sample service's adapters, written as harmony-service-lib's own example service is:
download each asset, work on it, ``stage`` the output to the message's staging location.
Nothing here knows about fairway."""

from __future__ import annotations

import shutil
from pathlib import Path
from tempfile import mkdtemp
from typing import Any

from harmony_service_lib import BaseHarmonyAdapter
from harmony_service_lib.exceptions import HarmonyException
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
                raise HarmonyException(f"granule {item.id} cannot be rewritten", "Service")
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
