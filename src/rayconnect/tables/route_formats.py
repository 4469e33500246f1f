"""A routed sink's formats by table with the keys its producers published
(``rayconnect.route_keys``): what its writer and coordinator key a table by when the table's
rule gives no key of its own and ``routes.published_keys`` is set."""

from __future__ import annotations

from rayconnect.config.routes import RouteFormats
from rayconnect.config.sink import SinkPipelineConfig
from rayconnect.formats.settings import RecordFormat
from rayconnect.route_keys import published


class PublishedFormats:
    """A routed sink's ``RouteFormats`` with the keys published for it, read again when a
    table not met yet is asked for (its key was published before its first record). For
    the sink's own processes (Ray connected); Spark's tasks get ``refresh()``'s plain
    formats."""

    def __init__(self, formats: RouteFormats, sink: str) -> None:
        self.formats, self.sink = formats, sink
        self._met: set[str] = set()

    def __call__(self, name: str) -> RecordFormat:
        if name not in self._met:
            self.refresh()
            self._met.add(name)
        return self.formats(name)

    @property
    def typed(self) -> bool:
        return self.formats.typed

    def refresh(self) -> RouteFormats:
        """The formats with every key published so far (blocking: a GCS read)."""
        import ray

        if ray.is_initialized():
            self.formats = self.formats.with_published(published(self.sink))
        return self.formats


def sink_formats(config: SinkPipelineConfig) -> RouteFormats | PublishedFormats:
    """A routed sink's formats by table: with ``routes.published_keys``, keyed by what its
    producers publish too."""
    formats = config.route_formats()
    if config.sink.routes is not None and config.sink.routes.published_keys:
        return PublishedFormats(formats, config.name)
    return formats
