"""A round's ``operationMetrics`` in its Delta commitInfo, spelled as Spark and delta-rs spell
them, so history views (``DESCRIBE HISTORY``, ``DeltaTable.history()``) and monitoring that
read the standard metrics see a round's rows, files and bytes.

delta-rs's ``create_write_transaction`` (which a round's commit must use: it adds files
written elsewhere, with txn actions) writes no ``operationMetrics`` of its own, unlike its
``write_deltalake``. Its ``CommitProperties.custom_metadata`` is typed ``dict[str, str]``
but goes to the log as JSON values (delta-rs 1.6.6: a dict value lands as a JSON object),
and a key of it that commitInfo also has fills that field: so ``operationMetrics`` is given
as a custom key holding a map. Spark writes its metrics as strings (``numFiles``,
``numOutputRows``, ``numOutputBytes``), delta-rs as integers (``num_added_files``,
``num_added_rows``): both spellings go in, each as its own writer writes it, so a tool
of either family finds the figures it knows.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from deltalake.transaction import AddAction

#: the commitInfo field the metrics go in
OPERATION_METRICS = "operationMetrics"


def operation_metrics(adds: Sequence[AddAction]) -> dict[str, Any]:
    """The standard metrics of a version that adds ``adds`` and removes nothing (rows from
    each file's ``numRecords`` stats)."""
    rows = sum(_records(add) for add in adds)
    size = sum(add.size for add in adds)
    partitions = {tuple(sorted(add.partition_values.items())) for add in adds}
    partitions.discard(())
    return {
        # Spark (a WRITE, and a streaming append's numAddedFiles / numRemovedFiles)
        "numFiles": str(len(adds)),
        "numAddedFiles": str(len(adds)),
        "numRemovedFiles": "0",
        "numOutputRows": str(rows),
        "numOutputBytes": str(size),
        # delta-rs (write_deltalake)
        "num_added_files": len(adds),
        "num_removed_files": 0,
        "num_added_rows": rows,
        "num_partitions": len(partitions),
    }


def _records(add: AddAction) -> int:
    """``numRecords`` of the file's stats (every file a round adds has them)."""
    return int(json.loads(add.stats)["numRecords"]) if add.stats else 0
