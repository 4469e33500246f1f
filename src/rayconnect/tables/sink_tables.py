"""A sink's table(s) as the coordinator commits to them: the one place that knows whether a
sink writes one table or, with routes, many (``RoundCommitter``: the same contract)."""

from __future__ import annotations

from rayconnect.config.sink import SinkPipelineConfig
from rayconnect.tables.factory import open_committer
from rayconnect.tables.round_committer import RoundCommitter
from rayconnect.tables.table_set import TableSet
from rayconnect.write_modes.row_delta import Search, search_here


def open_round_committer(
    config: SinkPipelineConfig, search: Search = search_here
) -> RoundCommitter:
    """The committer of ``config``'s rounds (no IO yet); ``search``: where merge-on-read
    rounds search their keys (``write_modes.key_search``)."""
    if config.sink.routes is not None:
        from rayconnect.tables.route_formats import sink_formats

        return TableSet(config.sink, config.name, sink_formats(config), search)
    return open_committer(config.sink, config.name, config.record_format(), search)
