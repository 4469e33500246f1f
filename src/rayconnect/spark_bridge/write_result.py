"""``WriteResult``: what one write of a round's groups did - each group's files, the job
ids that prove it ran as one Spark job, and where its time went."""

from __future__ import annotations

from dataclasses import dataclass, field

from rayconnect.protocol.types import DataFile


@dataclass(frozen=True)
class WriteResult:
    """What one ``write_groups`` call did; ``job_ids`` proves it ran a single Spark job."""

    files: list[list[DataFile]]
    job_ids: list[int] = field(default_factory=list)
    staging_dir: str | None = None  # relative to the table root
    seconds: float = 0.0
    prepare_seconds: float = 0.0  # lend refs to the holder + build the lazy DataFrame
    spark_seconds: float = 0.0  # the Spark job itself
    #: a routed write's tables whose files do not match the schema they were decoded
    #: against (new columns, or a table not made yet): their schema changes at the commit
    schema_changes: tuple[str, ...] = ()


def merge_results(results: list[WriteResult]) -> WriteResult:
    """One result of a write made as several jobs (a transform's layers: ``group_order``)."""
    files = [sum((r.files[i] for r in results), []) for i in range(len(results[0].files))]
    return WriteResult(
        files=files,
        job_ids=sorted(j for r in results for j in r.job_ids),
        staging_dir=results[0].staging_dir,
        seconds=sum(r.seconds for r in results),
        prepare_seconds=sum(r.prepare_seconds for r in results),
        spark_seconds=sum(r.spark_seconds for r in results),
    )
