"""What ``rayconnect run --embedded-s3`` tells the user about the store it started.

Why a notice at all: the store's keys are made per run and it lives only as long as the
command, so without them printed its table could not be read from outside, and a reader
would find nothing after the run ended. So ``run`` prints the endpoint, the keys (as the
environment variables every S3 client reads), a command that reads the table as printed,
and when the store goes. The keys are a throwaway local store's, bound to 127.0.0.1.
"""

from __future__ import annotations

import sys

from rayconnect.storage.embedded_s3 import EmbeddedS3

__all__ = ["embedded_s3_notice"]


def embedded_s3_notice(s3: EmbeddedS3, table_uri: str, delta: bool = True) -> list[str]:
    """The lines ``run`` prints once the store is up: where, its keys, a read command (for a
    Delta table: this interpreter and Polars), and that it is removed on exit."""
    env = s3.env()
    lines = [
        f"embedded S3 at {s3.endpoint_url} (ready in {s3.start_seconds:.1f} s); table {table_uri}",
        "  keys     " + " ".join(f"{k}={v}" for k, v in env.items()),
    ]
    if delta:
        read = f"print(pl.read_delta('{table_uri}', storage_options={env!r}))"
        lines.append(f'  read it  {sys.executable} -c "import polars as pl; {read}"')
    lines.append(
        "  the store and everything in it are removed when this command exits: "
        "read the table while it runs"
    )
    return lines
