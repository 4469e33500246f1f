"""The cut markers a source writes for sinks with consistent cuts (``protocol/cut_marks.py``).

One marker per topic, copied to every partition the topic has (``every_partition``), in the
Kafka transaction it ends. A source may write them only where that transaction ends at a
commit of its own source (never inside a source transaction split over Kafka transactions),
with the commit position of the last source transaction in it: then every partition's
records before a marker come from transactions committed at or before it, and those after
from later ones.
"""

from __future__ import annotations

from collections.abc import Iterable

from rayconnect.protocol.cut_marks import CUT_HEADER
from rayconnect.source_tasks.base import SourceRecord


def cut_markers(topics: Iterable[str], position: int) -> list[SourceRecord]:
    """The markers of the cut at ``position`` for each of ``topics``: no key, no value,
    only the header (a consumer that does not know them sees a tombstone without a key -
    why a source writes them only when asked)."""
    headers = ((CUT_HEADER, str(position).encode()),)
    return [SourceRecord(topic, None, headers=headers, every_partition=True) for topic in topics]
