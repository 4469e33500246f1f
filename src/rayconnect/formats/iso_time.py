"""Which inferred JSON strings are timestamps: the rule, one place.

JSON has no timestamp type; Arrow's reader infers one only when every value of a block is an
ISO-8601 time *without* fractional seconds, so ``"2024-05-01T12:00:00.123Z"`` - what most
producers write - stayed a string column. The rule here, for a column that is NEW to the
table (its type is being decided; a column the table has keeps its type, so the decision is
made once and never flaps between rounds):

    every non-null value is ``YYYY-MM-DD``, optionally followed by ``T`` or a space and
    ``hh[:mm[:ss[.f]]]`` with 1 to 6 fractional digits, optionally followed by ``Z`` or an
    offset ``+hh``, ``+hhmm``, ``+hh:mm`` (also ``-``), and is a real calendar time
    -> a timestamp column (µs, UTC: an offset is converted, a time without one is UTC).

These are exactly the forms Arrow's own ISO-8601 parser reads into a µs timestamp, which is
what parses the column's values in every later round (the table's type steers the parser):
a value the rule accepted once is accepted again. More than 6 fractional digits (ns) would
not be, so such a column stays a string; a single value that is not a timestamp keeps the
whole column a string.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from rayconnect.formats.types import TIMESTAMP

_TIME = r"[T ]\d{2}(:\d{2}(:\d{2}(\.\d{1,6})?)?)?"
_ZONE = r"(Z|[+-]\d{2}(:?\d{2})?)"
_ISO = rf"^\d{{4}}-\d{{2}}-\d{{2}}({_TIME}{_ZONE}?)?$"
_ZONED = rf"{_TIME}{_ZONE}$"
#: stand-ins where the other branch's cast must not see a value
_ZONED_EPOCH, _NAIVE_EPOCH = "1970-01-01T00:00:00Z", "1970-01-01T00:00:00"


def as_timestamps(strings: pa.Array) -> pa.Array | None:
    """``strings`` as timestamps (µs, UTC) if every non-null one is an ISO-8601 time by the
    rule above; None if not (or if none has a value: a column of nulls says nothing)."""
    if pc.all(pc.is_null(strings)).as_py():
        return None
    matches = pc.match_substring_regex(strings, _ISO)
    if not pc.all(pc.fill_null(matches, True)).as_py():
        return None
    zoned = pc.match_substring_regex(strings, _ZONED)
    try:
        with_zone = pc.if_else(zoned, strings, _ZONED_EPOCH).cast(TIMESTAMP)
        naive = pc.if_else(zoned, _NAIVE_EPOCH, strings).cast(pa.timestamp("us")).cast(TIMESTAMP)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None  # the pattern's shape but not a calendar time (Feb 30, 24:00)
    return pc.if_else(zoned, with_zone, naive)


def infer_timestamps(column: pa.Array) -> pa.Array:
    """``column`` with its string values - also inside structs and lists - that are
    timestamps by the rule made timestamps, each string leaf decided on its own."""
    t = column.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        converted = as_timestamps(column.cast(pa.string()))
        return column if converted is None else converted
    if pa.types.is_struct(t):
        children = [infer_timestamps(column.field(i)) for i in range(t.num_fields)]
        if all(c.type == t.field(i).type for i, c in enumerate(children)):
            return column
        fields = [t.field(i).with_type(c.type) for i, c in enumerate(children)]
        return pa.StructArray.from_arrays(children, fields=fields, mask=column.is_null())
    if pa.types.is_list(t):
        values = infer_timestamps(column.values)
        if values.type == t.value_type:
            return column
        offsets = column.offsets
        return pa.ListArray.from_arrays(offsets, values, mask=column.is_null())
    return column


def timestamps_as_strings(t: pa.DataType) -> pa.DataType:
    """``t`` with Arrow's inferred timestamps read as strings instead, so the rule - not the
    block - decides (Arrow infers whole-second times only: two blocks of one column would
    otherwise disagree)."""
    if pa.types.is_timestamp(t):
        return pa.string()
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(timestamps_as_strings(t.field(i).type))
                          for i in range(t.num_fields)])  # fmt: skip
    if pa.types.is_list(t):
        return pa.list_(t.value_field.with_type(timestamps_as_strings(t.value_type)))
    return t
