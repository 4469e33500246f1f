"""``rayconnect mirror URL --to PATH`` (and ``rayconnect run FILE`` of a ``kind: mirror``
file): a Postgres database mirrored into lake tables, with the lag per table live, and the
mirror's part of ``status NAME`` / ``stop NAME`` (the two pipelines as one).

In the foreground a block of lines is shown every ``--interval`` seconds - the source task's
phase and WAL lag, the sink's rounds, then per table its version, rows and lag - redrawn in
place on a terminal, appended in a log. Ctrl-C/SIGTERM stops the mirror (the source, then the
sink once it read everything, see ``rc.Mirror``); a ``rayconnect stop NAME`` from elsewhere
ends the command too. At start and at the end it prints how to read the tables back.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from rayconnect.cli.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE, exit_code
from rayconnect.config.mirror import MirrorConfig
from rayconnect.errors import ConfigError, RayconnectError
from rayconnect.pipelines.mirror import MirrorHandle, MirrorRecord, MirrorStatus

#: lake tables shown in the live block (the most lagging first); ``status`` has them all
TABLES_SHOWN = 20


def _err(message: str) -> None:
    print(f"rayconnect: {message}", file=sys.stderr, flush=True)


def config_of_args(args: Any) -> MirrorConfig:
    """``rayconnect mirror``'s arguments as the config a ``kind: mirror`` file holds."""
    fields: dict[str, Any] = {"database": args.database, "to": args.to, "format": args.format}
    name = args.name or _default_name(args.database)
    for field in ("tables", "kafka", "topic_prefix", "password_env", "slot", "publication"):
        value = getattr(args, field)
        if value:
            fields[field] = value.split(",") if field == "tables" else value
    if args.partitions:
        fields["partitions"] = args.partitions
    return MirrorConfig(name=name, **fields)


def _default_name(url: str) -> str:
    """``<database>-mirror`` (the URL's database name), or ``mirror``."""
    import re
    import urllib.parse

    try:
        database = urllib.parse.urlsplit(url).path.lstrip("/")
    except ValueError:
        database = ""
    database = re.sub(r"[^A-Za-z0-9_.-]", "-", database)
    return f"{database}-mirror" if database else "mirror"


def mirror_command(args: Any) -> int:
    try:
        config = config_of_args(args)
    except ConfigError as e:
        _err(str(e))
        return exit_code(e)
    return run_mirror(config, args, "rayconnect mirror")


def run_mirror(config: MirrorConfig, args: Any, where: str) -> int:
    """Start the mirror; with ``args.detach`` return, else watch it until a stop signal."""
    from rayconnect.cli.stop_signals import stop_signals
    from rayconnect.pipelines.mirror import Mirror

    if config.kafka is None and args.detach:
        _err(
            "--detach needs a Kafka (kafka: / --kafka): without one the mirror's embedded "
            "broker lives in this process"
        )
        return EXIT_USAGE
    kafka = config.kafka or "an embedded broker (tansu, for this command's lifetime)"
    print(
        f"starting mirror {config.name!r}: database {config.database_name!r} "
        f"({', '.join(config.tables) or 'every table of schema public'}) -> {kafka} -> "
        f"{config.format} tables in {config.to}",
        flush=True,
    )
    started = time.monotonic()
    try:
        handle = Mirror.from_config(config).start(address=args.address)
    except RayconnectError as e:
        _err(f"{where}: {e}" if isinstance(e, ConfigError) else str(e))
        return exit_code(e)
    print(
        f"mirror {config.name!r} running ({time.monotonic() - started:.0f} s to start): source "
        f"pipeline {handle.source.name!r}, sink pipeline {handle.sink.name!r}"
        + (f", Kafka at {handle.broker.bootstrap_servers}" if handle.broker else ""),
        flush=True,
    )
    _print_read_back(handle.record, handle.status())
    if args.detach:
        print(
            f"detached: watch it with `rayconnect status {config.name} --watch`, stop it with "
            f"`rayconnect stop {config.name}` (add --drop-slot when it is deleted for good)",
            flush=True,
        )
        return EXIT_OK
    with stop_signals() as stop_requested:
        return _watch(handle, args.interval, stop_requested)


def _watch(handle: MirrorHandle, interval: float, stop_requested: list[str]) -> int:
    block = LiveBlock(sys.stdout)
    status = None
    try:
        while not stop_requested:
            t0 = time.monotonic()
            if not handle.running():
                print(f"mirror {handle.name!r} was stopped", flush=True)
                if handle.broker is not None:
                    handle.broker.stop()
                return EXIT_OK
            status = handle.status()
            block.show(mirror_lines(status))
            while not stop_requested and time.monotonic() - t0 < interval:
                time.sleep(min(0.2, interval))
        print(
            f"{stop_requested[0]}: stopping the source, then the sink once it has read "
            "everything...",
            flush=True,
        )
        result = handle.stop(commit=True)
    except KeyboardInterrupt:
        print("interrupted again: stopping without a last round", flush=True)
        handle.stop(commit=False, drain_timeout_s=0)
        return EXIT_FAILED
    print(stop_line(handle.name, result), flush=True)
    _print_read_back(handle.record, status)
    return EXIT_FAILED if result.sink.error else EXIT_OK


def stop_line(name: str, result: Any) -> str:
    """One line saying how a mirror's stop went."""
    sink = result.sink
    version = sink.final.table_version if sink.final else None
    return (
        f"stopped mirror {name}: source {len(result.source)} task(s) stopped; sink "
        + (
            f"committed its last round (routed tables' version {version})"
            if sink.error is None
            else f"last round not committed: {sink.error}"
        )
        + ("" if result.drained else "; the sink had not read everything (read on next start)")
        + ("; replication slot dropped" if result.slot_dropped else "")
    )


def mirror_lines(status: MirrorStatus) -> list[str]:
    """The live block: the source, the sink, then the most lagging tables."""
    lines = [f"{time.strftime('%H:%M:%S')} mirror {status.name}: {source_line(status)}"]
    sink = status.sink
    if sink is None:
        lines.append("  sink unavailable (restarting)")
    else:
        r = sink.rounds_since_start
        lines.append(
            f"  sink epoch {sink.epoch}: {r.committed} rounds committed, "
            f"{sink.records_committed_since_start or 0:,} changes since its start"
        )
        lines += [f"  sink {line}" for line in sink.partition_problems()]
    tables = sorted(
        status.sink.tables.items() if status.sink is not None else (),
        key=lambda item: -(item[1].lag or 0),
    )[:TABLES_SHOWN]
    width = max([len(n) for n, _ in tables] + [5])
    lines.append(f"  {'table':<{width}}  {'version':>8}  {'rows':>10}  {'lag':>8}")
    for name, t in tables:
        version = "-" if t.version is None else f"{t.version:,}"
        lag = "-" if t.lag is None else f"{t.lag:,}"
        lines.append(f"  {name:<{width}}  {version:>8}  {t.rows_since_start:>10,}  {lag:>8}")
    if not tables:
        lines.append("  (no table committed yet: the snapshot is on its way)")
    return lines + [f"  not mirrored: {why}" for why in refused_tables(status)]


def refused_tables(status: MirrorStatus) -> list[str]:
    """Why each table the source found while streaming is not mirrored (no primary key)."""
    source = status.source
    task = source.tasks.get(0) if source is not None else None
    report = task.source if task is not None else None
    return list((report or {}).get("tables_refused", {}).values())


def source_line(status: MirrorStatus) -> str:
    """The source task's phase and how far behind the WAL it is."""
    source = status.source
    task = source.tasks.get(0) if source is not None else None
    if task is None or task.records_committed is None:
        return "source task unavailable (restarting)"
    behind = "lag -"
    if task.lag is not None and task.lag.bytes is not None:
        behind = f"{task.lag.bytes:,} B / {task.lag.seconds or 0:.1f} s behind the WAL"
    return f"source {task.state}: {task.records_committed:,} changes committed, {behind}"


class LiveBlock:
    """A block of lines redrawn in place on a terminal, appended otherwise (a log)."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.tty = bool(getattr(out, "isatty", lambda: False)())
        self._drawn = 0

    def show(self, lines: list[str]) -> None:
        if self.tty and self._drawn:
            print(f"\x1b[{self._drawn}F\x1b[J", end="", file=self.out)
        print("\n".join(lines), file=self.out, flush=True)
        self._drawn = len(lines) if self.tty else 0


def read_back_lines(record: MirrorRecord, tables: list[str]) -> list[str]:
    """How to read the mirror's tables: one command for a table (Delta: Polars and DuckDB,
    as the demo prints; Iceberg: pyiceberg on the embedded catalog)."""
    from rayconnect.demo.sink import read_commands

    table = tables[0] if tables else "<table>"
    if record.format == "iceberg":
        return _iceberg_read_back(record, table, tables)
    path = f"{record.to.rstrip('/')}/{table}"
    polars, duck = read_commands(path)
    return [
        f"read a table (each is {record.to.rstrip('/')}/<table>"
        + (f": {', '.join(tables)}" if tables else "")
        + "):",
        f"  {polars}",
        f"  {duck}",
    ]


def _iceberg_read_back(record: MirrorRecord, table: str, tables: list[str]) -> list[str]:
    """pyiceberg on the embedded catalog (its properties as the sink opens it); a catalog
    of the user's: the table's name in it."""
    namespace = record.iceberg_namespace
    if namespace is None:
        return [
            f"the tables are in your Iceberg catalog, namespace of the mirror's topic prefix: "
            f"load_catalog(...).load_table('<namespace>.{table}').scan().to_arrow()"
        ]
    from rayconnect.config.sink import IcebergSink

    sink = IcebergSink(f"{namespace}.{table}", warehouse=record.to)
    props = sink.catalog_properties()  # (a SQL catalog's tables are under its name)
    code = (
        f"from pyiceberg.catalog import load_catalog; "
        f"c = load_catalog({sink.catalog_name!r}, **{props!r}); "
        f"print(c.load_table('{namespace}.{table}').scan().to_arrow())"
    )
    listed = f": {', '.join(tables)}" if tables else ""
    return [
        f"read a table (each is {namespace}.<table> in the catalog under {record.to}{listed}):",
        f'  {sys.executable} -c "{code}"',
    ]


def _print_read_back(record: MirrorRecord, status: MirrorStatus | None) -> None:
    tables = sorted(status.sink.tables) if status is not None and status.sink else []
    print("\n".join(read_back_lines(record, tables)), flush=True)


# -- status NAME, stop NAME ------------------------------------------------------------------


def mirror_stop_command(record: MirrorRecord, args: Any) -> int:
    handle = MirrorHandle(record.name, record)
    drop = getattr(args, "release", False)
    print(
        f"rayconnect: mirror {record.name}: stopping the source, then the sink"
        + (" once it read everything" if args.commit else "")
        + ("; then dropping the replication slot" if drop else ""),
        file=sys.stderr,
        flush=True,
    )
    try:
        result = handle.stop(
            commit=args.commit, drop_slot=drop, timeout_s=args.timeout, drain_timeout_s=60
        )
    except RayconnectError as e:
        _err(f"mirror {record.name}: {e}")
        return exit_code(e)
    print(stop_line(record.name, result), flush=True)
    failed = [f"{n}: {r.error}" for n, r in result.source.items() if r.error]
    for problem in failed:
        _err(problem)
    return EXIT_FAILED if failed or result.sink.error else EXIT_OK
