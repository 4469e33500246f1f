"""Where a merge-on-read round's key search runs: in the pipeline's writer - on Spark's
executors when Spark is up, in the writer's process when it is not - else where the round
commits.

The search (``row_delta.SearchJob``: the round's keys joined with the candidate files' key
columns) reads the key column of every file the statistics could not rule out: on a table
whose files all span the key range that is most of the table's key column, per round. The
coordinator's process runs the protocol's rounds; a search there competes with them, and
cannot use more cores than that one process has. So the job goes where the writes go, and
follows them onto Spark's executors by the writer's own rule (``spark.start``): once the load
started Spark, the job is a ``mapInArrow`` over the candidate files, one task per executor
core (``spark_bridge.key_search``).

The answer is the same wherever it runs (a pure function of the job), so the writer being
away - killed, restarting, not started yet, no Ray at all (a table used from a script) - is
not an error: the job runs here instead, and the status says how many did.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from rayconnect.protocol.status import KeySearchCounts
from rayconnect.write_modes.row_delta import SearchJob, search_here

log = logging.getLogger(__name__)

#: how long a search may take in the writer before it is run here instead (a writer whose
#: Spark lost its executors can hang a job; the commit must not)
WRITER_SEARCH_TIMEOUT_S = 120.0


@dataclass
class SearchOnWriter:
    """Runs a search job in the writer actor ``writer`` (namespace ``namespace``); here if
    there is no writer to ask or it does not answer in ``timeout_s``."""

    writer: str
    namespace: str
    timeout_s: float = WRITER_SEARCH_TIMEOUT_S
    #: where the searches ran (status; the writer counts which of its ran on Spark)
    counts: KeySearchCounts = field(default_factory=KeySearchCounts)

    def __call__(self, job: SearchJob) -> list[np.ndarray]:
        import ray

        if ray.is_initialized():
            try:
                handle = ray.get_actor(self.writer, namespace=self.namespace)
                found: list[np.ndarray] = ray.get(
                    handle.find_rows.remote(job), timeout=self.timeout_s
                )
            except (ValueError, ray.exceptions.RayError) as e:  # no such actor; died; slow
                why = f"{type(e).__name__}: {str(e).strip()[:200]}"
                self._count(here=1, last_fallback=why)
                log.warning("key search in %s failed, searching here: %s", self.writer, why)
                return search_here(job)
            self._count(on_writer=1)
            return found
        self._count(here=1)
        return search_here(job)

    def _count(self, on_writer: int = 0, here: int = 0, last_fallback: str | None = None) -> None:
        c = self.counts
        self.counts = KeySearchCounts(
            on_writer=c.on_writer + on_writer,
            here=c.here + here,
            last_fallback=last_fallback or c.last_fallback,
        )
