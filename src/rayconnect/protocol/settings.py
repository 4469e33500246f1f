"""``CommitSettings``: how rounds are paced (RFC-32) and when participants flush (KIP-89).

The one place these settings and their defaults are written: the coordinator and participant
machines read them, ``rc.SinkPipeline(...)`` takes them as keywords, and a pipeline file's
``commit:`` block decodes into this Struct.
"""

from __future__ import annotations

import msgspec

from rayconnect.errors import require


class CommitSettings(msgspec.Struct, frozen=True):
    """``commit_interval_s`` runs from the previous round's END (participants read on in
    between) to this round's END; ``write_timeout_s`` from END to the (partial) commit."""

    #: time between one round's END and the next (the next START comes after the commit, but reading
    #: never stopped); a participant whose buffer keeps filling ends a round earlier with REQUEST-
    #: COMMIT
    commit_interval_s: float = 10.0
    #: how long the coordinator waits for WRITE-STATUS after END before committing the partitions that
    #: reported
    write_timeout_s: float = 60.0
    #: a participant flushes its buffer to the writer once it holds this many records (KIP-89): memory
    #: stays bounded inside a long round
    flush_max_records: int = 200_000
    #: ... or this many bytes
    flush_max_bytes: int = 64 * 1024 * 1024
    #: ... or its oldest record waited this long
    flush_max_age_s: float = 30.0
    #: REQUEST-COMMIT after this many flushes in one round (KIP-89's request_commit); 0: never
    request_commit_after_flushes: int = 4
    #: end a round as soon as a partition with data in it has read all there is: the
    #: lowest latency (a table version per write, ~1 s apart), and a backlog's last round
    #: does not wait out the interval. Off: a version per commit_interval_s.
    commit_when_caught_up: bool = False
    #: end a round as soon as a backlog is drained: a partition that read a flush's worth
    #: (flush_max_records or flush_max_bytes) since it last caught up has read all there is,
    #: or the partitions' reads between two catch-ups, over the last commit_interval_s, add
    #: up to a flush's worth (a backlog spread over many partitions; protocol/
    #: drain_window.py). A backlog lands at read speed instead of waiting out the interval,
    #: while steady traffic keeps a version per commit_interval_s. Implied by
    #: commit_when_caught_up.
    commit_when_drained: bool = True
    #: every round ends every partition at one source LSN, so the tables of a routed sink
    #: fed by one database are, version by version, a consistent cut of it (the source
    #: writes cut markers: the Postgres source's ``cut_markers``; docs/guides/
    #: database-mirror.md#consistent-cuts). Costs about one commit_interval_s of freshness.
    consistent_cuts: bool = False

    def __post_init__(self) -> None:
        require(self.commit_interval_s > 0, "commit_interval_s must be > 0")
        require(self.write_timeout_s > 0, "write_timeout_s must be > 0")
        require(self.flush_max_records > 0, "flush_max_records must be > 0")
        require(self.flush_max_bytes > 0, "flush_max_bytes must be > 0")
        require(self.flush_max_age_s > 0, "flush_max_age_s must be > 0")
        require(
            self.request_commit_after_flushes >= 0,
            "request_commit_after_flushes must be >= 0 (0: never ask for an early commit)",
        )
