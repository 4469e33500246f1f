"""Constrained numbers for settings Structs: msgspec enforces them when a pipeline file is
decoded (or ``msgspec.convert`` builds a Struct), so every settings class says its bounds
once, in its annotations, instead of in a check beside it."""

from __future__ import annotations

from typing import Annotated

import msgspec

PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
NonNegativeInt = Annotated[int, msgspec.Meta(ge=0)]
PositiveFloat = Annotated[float, msgspec.Meta(gt=0)]
NonNegativeFloat = Annotated[float, msgspec.Meta(ge=0)]
