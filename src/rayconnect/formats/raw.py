"""``raw``: the value bytes as they are, in one binary column ``value``."""

from __future__ import annotations

import pyarrow as pa

from rayconnect.formats.base import Decoded


class RawDecoder:
    """Keeps the bytes: nothing can be bad."""

    def decode(self, values: pa.Array, table_schema: pa.Schema | None) -> Decoded:
        return Decoded(pa.table({"value": values.cast(pa.binary())}))
