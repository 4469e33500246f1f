"""``string``: the value as UTF-8 text, in one string column ``value``.

Validated by Arrow's cast (vectorized); only when a block holds invalid UTF-8 is each value
checked on its own, to name the bad ones.
"""

from __future__ import annotations

import pyarrow as pa

from rayconnect.formats.base import Decoded


class StringDecoder:
    """UTF-8 text; invalid UTF-8 is a bad record."""

    def decode(self, values: pa.Array, table_schema: pa.Schema | None) -> Decoded:
        values = values.cast(pa.binary())
        try:
            return Decoded(pa.table({"value": values.cast(pa.string())}))
        except pa.ArrowInvalid:
            pass
        bad: dict[int, str] = {}
        for i, v in enumerate(values.to_pylist()):  # error path only
            if v is None:
                continue
            try:
                v.decode("utf-8")
            except UnicodeDecodeError as e:
                bad[i] = f"not UTF-8: {e}"
        good = values.filter(pa.array([i not in bad for i in range(len(values))]))
        return Decoded(pa.table({"value": good.cast(pa.string())}), bad)
