"""The price file of ``tranche report --prices``: a price per GPU-hour by product name.

.. code-block:: yaml

    currency: EUR
    products:
      NVIDIA H100 80GB HBM3:         # the devices' productName attribute
        gpu_hour: 2.80               # one whole GPU for one hour
        mig:                         # optional: one MIG device of a profile for one hour
          1g.10gb: 0.45

A MIG profile without an explicit price costs ``gpu_hour`` times its share of
the GPU's memory slices (``3g.40gb`` holds 4 of an H100's 8: half the GPU's
price). Prices are :class:`~decimal.Decimal` from the file's text, never floats.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from driver.errors import ConfigError

Price = Annotated[Decimal, Field(ge=0, allow_inf_nan=False)]
Currency = Annotated[str, StringConstraints(pattern=r"^[A-Z]{3}$")]


class PriceFileError(ConfigError):
    """A price file that cannot be read or does not validate (names the file and field)."""


class ProductPrice(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_hour: Price
    mig: dict[str, Price] = Field(default_factory=dict)


class Prices(BaseModel):
    """Validated prices; ``currency`` is an ISO 4217 code such as EUR or USD."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    currency: Currency
    products: dict[str, ProductPrice] = Field(min_length=1)
    source: str = ""  # the file, for messages


def _where(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def _message(err: ValidationError) -> str:
    parts = []
    for e in err.errors():
        text = str(e["msg"])
        if e["loc"] and e["loc"][0] == "currency" and e["type"] == "string_pattern_mismatch":
            text = f"{e.get('input')!r} is not a three-letter ISO 4217 code such as EUR or USD"
        parts.append(f"field {_where(e['loc'])}: {text}")
    return "; ".join(parts)


def parse_prices(text: str, source: str) -> Prices:
    """Prices from YAML text; ``source`` names the file in every message."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise PriceFileError(f"price file {source}: not YAML: {err}") from err
    if not isinstance(doc, dict):
        raise PriceFileError(f"price file {source}: expected a mapping with currency and products")
    if "source" in doc:
        raise PriceFileError(f"price file {source}: field source: unknown field")
    # Prices as written, not as binary floats: 0.1 stays 0.1.
    try:
        fields = {str(k): _decimals(v) for k, v in doc.items()}
        prices = Prices.model_validate({**fields, "source": source})
    except ValidationError as err:
        raise PriceFileError(f"price file {source}: {_message(err)}") from err
    return prices


def _decimals(value: object) -> object:
    if isinstance(value, dict):
        return {k: _decimals(v) for k, v in value.items()}
    if isinstance(value, float):
        return Decimal(repr(value))
    return value


def load_prices(path: Path) -> Prices:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise PriceFileError(f"price file {path}: cannot be read: {err}") from err
    return parse_prices(text, str(path))
