"""The PostgreSQL change-data source (``task: {type: postgres}``): see ``task``, and
docs/guides/postgres-source.md. Pure parts: ``pgoutput`` (decoding), ``values`` (typing),
``events`` (Debezium change events), ``progress`` (the source offset); IO: ``catalog``
(connections, checks, slots), ``snapshot``, ``stream``."""

from rayconnect.source_tasks.postgres.settings import PostgresSettings
from rayconnect.source_tasks.postgres.task import PostgresSource

__all__ = ["PostgresSettings", "PostgresSource"]
