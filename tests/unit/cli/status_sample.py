"""A sink pipeline's ``PipelineStatus`` as the coordinator and handle would report it, for
the CLI's tests: every required field set, anything else as given."""

from __future__ import annotations

from typing import Any

import msgspec

from rayconnect.protocol.status import PipelineStatus, RoundCounts


def pipeline_status(rounds: dict[str, int] | None = None, **fields: Any) -> PipelineStatus:
    counts = dict.fromkeys(RoundCounts.__struct_fields__, 0) | (rounds or {})
    base: dict[str, Any] = dict(
        pipeline="orders",
        state="started",
        epoch=1,
        txn_id=3,
        started_at=0.0,
        table="/t",
        table_version=2,
        partitions=(),
        rounds_since_start=counts,
    )
    return msgspec.convert(base | fields, PipelineStatus)
