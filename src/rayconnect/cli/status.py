"""``rayconnect list``, ``status NAME [--watch] [--json]`` and ``stop NAME``.

Both kinds of pipeline are found by their actors' names in namespace ``rayconnect``: a sink
pipeline has ``<pipeline>/coordinator``, a source pipeline ``<pipeline>/task/<i>``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec

from rayconnect.cli.exit_codes import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, exit_code
from rayconnect.errors import RayconnectError
from rayconnect.pipelines.mirror import MirrorRecord, find_mirror
from rayconnect.protocol.source_status import PastError, SourcePipelineStatus
from rayconnect.protocol.source_status import encode as encode_source
from rayconnect.protocol.status import PipelineStatus, WriterStatus, encode
from rayconnect.redact import redact
from rayconnect.runtime import connect


def pipeline_kind(name: str) -> str | None:
    """``"sink"``, ``"source"`` or None (no such pipeline runs)."""
    from rayconnect.actors import names
    from rayconnect.actors.directory import get_actor
    from rayconnect.runtime import task_actor_names

    if get_actor(names.coordinator(name)) is not None:
        return "sink"
    if task_actor_names(name):
        return "source"
    return None


def source_pipeline_status(name: str) -> SourcePipelineStatus:
    """A source pipeline's status (per task) with its actors, credentials masked."""
    from rayconnect.pipelines.source import SourcePipelineHandle
    from rayconnect.runtime import actor_statuses

    status = SourcePipelineHandle(name).status()
    status = msgspec.structs.replace(status, actors=tuple(actor_statuses(name)))
    return msgspec.convert(redact(status), SourcePipelineStatus, strict=False)


def pipeline_status(name: str) -> PipelineStatus:
    """Everything ``status`` shows (the handle's status with the actors), credentials
    masked: what ``--json`` prints, exactly."""
    from rayconnect.pipelines.sink import PipelineHandle

    status = PipelineHandle(name).status(actors=True)
    return msgspec.convert(redact(msgspec.to_builtins(status, enc_hook=str)), PipelineStatus)


def _n(value: Any) -> str:
    return "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def render_status(s: PipelineStatus | SourcePipelineStatus) -> str:
    if not isinstance(s, PipelineStatus):
        return render_source_status(s)
    lines = []
    total_lag = sum(p.lag or 0 for p in s.partition_status.values())
    lines.append(
        f"pipeline {s.pipeline}  state {s.state}  epoch {s.epoch}  "
        f"table version {_n(s.table_version)}  ({s.table})"
    )
    last = s.last_round_duration_s
    lines.append(
        f"round {s.txn_id}  last round {'-' if last is None else f'{last:.2f} s'}  "
        f"median {_fmt_s(s.round_s_median)}  max {_fmt_s(s.round_s_max)}  "
        f"commit median {_fmt_s(s.commit_s_median)}"
    )
    r = s.rounds_since_start
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s.started_at))
    lines.append(
        f"since {started} (coordinator start): rounds committed {r.committed} "
        f"(partial {r.partial})  discarded {r.discarded}  empty {r.empty}  "
        f"ended early {r.requested} (backlog drained {r.drained})  "
        f"records committed {_n(s.records_committed_since_start)}"
    )
    lines.append(f"lag {total_lag:,}")
    if s.committed_cut is not None:  # commit.consistent_cuts
        lines.append(f"committed cut: LSN {s.committed_cut}")
    for label in ("gave_up", "fenced", "error", "last_error"):
        if value := getattr(s, label):
            lines.append(f"{label}: {value}")
    if failed := s.last_failed_commit:
        lines.append(f"last failed commit: {failed.line()}")
    lines += [f"outage: {o}" for o in s.outages]
    if upkeep := s.upkeep:
        lines.append(
            f"table upkeep: {upkeep.compactions} compactions "
            f"({upkeep.compactions_given_up} given up), {upkeep.tidies} tidies "
            f"({upkeep.tidies_failed} failed), {upkeep.files_since_compaction} files "
            "since the last compaction"
            + (f"; last error: {upkeep.last_error}" if upkeep.last_error else "")
        )
    if dead := s.dead_letters:  # typed tables, errors: dead_letter
        per = ", ".join(f"{k}={n:,}" for k, n in dead.items())
        lines.append(f"dead letters {sum(dead.values()):,} in the table ({per})")
    if writer := s.writer:
        lines.append(
            f"spark executors {_n(writer.executors)} of {_n(writer.executors_wanted)}"
            f"  {writer.problem or writer.error or _spark_state(writer)}"
        )
    lines += _render_tables(s)
    lines.append("")
    width = max([len(k) for k in s.partition_status] + [9])
    lines.append(
        f"{'partition':<{width}}  {'committed':>12}  {'high water':>12}  {'lag':>10}  host"
    )
    for key, p in s.partition_status.items():
        host = (p.host or "-").split("/participants/")[-1]
        lines.append(
            f"{key:<{width}}  {_n(p.committed_offset):>12}  {_n(p.high_watermark):>12}  "
            f"{_n(p.lag):>10}  {host}" + ("" if p.state == "ok" else f"  {p.state.upper()}")
        )
    lines += s.partition_problems()
    lines.append("")
    lines += _render_actors([msgspec.to_builtins(a) for a in s.actors or ()])
    return "\n".join(lines)


#: route tables listed by ``status`` (the most lagging first); ``--json`` has them all
TABLES_SHOWN = 20


def _render_tables(s: PipelineStatus) -> list[str]:
    """A routed sink's tables: version, rows since the coordinator started, lag and the
    last commit; the ``TABLES_SHOWN`` most lagging (then the most recently idle) ones."""
    if not s.tables:
        return []
    shown = sorted(
        s.tables.items(), key=lambda item: (-(item[1].lag or 0), item[1].last_commit_at or 0)
    )[:TABLES_SHOWN]
    width = max([len(name) for name, _ in shown] + [5])
    lines = [
        "",
        f"{len(s.tables)} route tables"
        + (f" ({TABLES_SHOWN} most lagging shown)" if len(s.tables) > TABLES_SHOWN else ""),
        f"{'table':<{width}}  {'version':>8}  {'rows':>12}  {'lag':>10}  last commit",
    ]
    for name, t in shown:
        when = "-"
        if t.last_commit_at is not None:
            when = time.strftime("%H:%M:%S", time.localtime(t.last_commit_at))
        lines.append(
            f"{name:<{width}}  {_n(t.version):>8}  {_n(t.rows_since_start):>12}  "
            f"{_n(t.lag):>10}  {when}"
        )
    return lines


def _spark_state(writer: WriterStatus) -> str:
    """Healthy, still starting (no executor count yet), or not started on purpose
    (``spark.start: when_needed``, writes made in the writer's process)."""
    if writer.executors is not None:
        return "ok"
    if writer.spark_start == "when_needed" and writer.spark_started_because is None:
        return "Spark not started: the writer's process writes until it is busy (when_needed)"
    return "starting Spark"


def _render_actors(actors: list[dict[str, Any]]) -> list[str]:
    width = max([len(a["name"]) for a in actors] + [5])
    lines = [f"{'actor':<{width}}  {'state':<11}  {'pid':>8}  {'restarts':>8}"]
    for a in actors:
        lines.append(
            f"{a['name']:<{width}}  {a['state']:<11}  {_n(a['pid']):>8}  {_n(a['restarts']):>8}"
        )
    return lines


def render_source_status(s: SourcePipelineStatus) -> str:
    lines = [
        f"source pipeline {s.pipeline}  tasks {len(s.tasks)}  "
        f"records committed {_n(s.records_committed)}  transactions "
        f"{_n(s.transactions_committed)} committed / {_n(s.transactions_aborted)} aborted"
    ]
    lines += [f"warning: {w}" for w in s.warnings]
    lines.append("")
    lines.append(
        f"{'task':>4}  {'state':<12}  {'committed':>9}  {'aborted':>7}  {'records':>12}  "
        f"{'restarts':>8}  {'partitions':>10}  {'lag':>16}  last error"
    )
    for index, t in sorted(s.tasks.items()):
        lag = "-"
        if t.lag is not None and t.lag.bytes is not None:
            # no seconds: the slot's lag asked of Postgres while the task is down
            seconds = "" if t.lag.seconds is None else f" / {t.lag.seconds:.1f} s"
            lag = f"{t.lag.bytes:,} B{seconds}"
        lines.append(
            f"{index!s:>4}  {t.state:<12}  {_n(t.transactions_committed):>9}  "
            f"{_n(t.transactions_aborted):>7}  {_n(t.records_committed):>12}  "
            f"{_n(t.restarts):>8}  {len(t.committed_offsets):>10}  {lag:>16}  "
            f"{t.gave_up or t.last_error or t.error or _recovered(t.errors)}"
        )
    lines.append("")
    lines += _render_actors([msgspec.to_builtins(a) for a in s.actors or ()])
    return "\n".join(lines)


def _recovered(errors: tuple[PastError, ...]) -> str:
    """A healthy task's last-error column: '-', or the error it recovered from and when."""
    if not errors:
        return "-"
    last = errors[-1]
    when = time.strftime("%H:%M:%S", time.localtime(last.at))
    return f"none now (recovered from {last.error!r} at {when})"


def _fmt_s(v: Any) -> str:
    return "-" if v is None else f"{v:.2f} s"


def _not_running(name: str) -> int:
    print(f"rayconnect: no running pipeline named {name!r} (see: rayconnect list)", file=sys.stderr)
    return EXIT_NOT_FOUND


def _connect_or_exit(address: str | None) -> int | None:
    try:
        connect(address)
    except RayconnectError as e:
        print(
            f"rayconnect: no Ray cluster at {address or 'auto'} ({e}); start one with "
            "`ray start --head` or pass --address",
            file=sys.stderr,
        )
        return exit_code(e)
    return None


def status_json(s: PipelineStatus | SourcePipelineStatus, pretty: bool = True) -> str:
    """A status printed as exactly its Struct's JSON: ``rayconnect.protocol.status.decode``
    (a sink's) or ``rayconnect.protocol.source_status.decode`` (a source's) reads it back."""
    data = encode(s) if isinstance(s, PipelineStatus) else encode_source(s)
    return (msgspec.json.format(data, indent=2) if pretty else data).decode()


def status_command(args) -> int:
    if (code := _connect_or_exit(args.address)) is not None:
        return code
    if (mirror := find_mirror(args.name)) is not None:  # its two pipelines as one
        return watch(args, lambda: mirror_status_text(mirror, args))
    return watch(args, lambda: _pipeline_status_text(args))


def mirror_status_text(record: MirrorRecord, args) -> str | None:
    """What ``status NAME`` prints of a mirror: both pipelines' status (``--json``: one
    object ``{mirror, source, sink}``); None once the mirror stopped."""
    import contextlib

    if find_mirror(record.name) is None:
        return None
    source = sink = None  # one not answering (restarting) is shown as such
    with contextlib.suppress(Exception):
        source = source_pipeline_status(record.source)  # credentials masked, actors
    with contextlib.suppress(Exception):
        sink = pipeline_status(record.sink)
    if args.json:
        data = {
            "mirror": record.name,
            "source": None if source is None else msgspec.json.decode(status_json(source)),
            "sink": None if sink is None else msgspec.json.decode(status_json(sink)),
        }
        return msgspec.json.encode(data).decode()
    return "\n".join(
        [
            f"mirror {record.name}: source pipeline {record.source}, sink pipeline "
            f"{record.sink}, {record.format} tables in {record.to}",
            "",
            render_status(source) if source is not None else "source: not answering",
            "",
            render_status(sink) if sink is not None else "sink: not answering",
        ]
    )


def _pipeline_status_text(args) -> str | None:
    """What ``status NAME`` prints of a sink or source pipeline (None: none runs)."""
    from rayconnect.errors import PipelineNotFoundError

    kind = pipeline_kind(args.name)
    if kind is None:
        return None
    try:
        s = pipeline_status(args.name) if kind == "sink" else source_pipeline_status(args.name)
    except PipelineNotFoundError:
        return None
    return status_json(s, pretty=not args.watch) if args.json else render_status(s)


def watch(args, text: Callable[[], str | None]) -> int:
    """Print ``text()`` once, or with ``--watch`` every ``--interval`` s until Ctrl-C (the
    screen cleared on a terminal); exit 4 once it is None (nothing of that name runs)."""
    while True:
        shown = text()
        if shown is None:
            return _not_running(args.name)
        if args.watch and not args.json and sys.stdout.isatty():
            print("\x1b[2J\x1b[H", end="")
        print(shown, flush=True)
        if args.watch and not args.json:
            print(f"\n(every {args.interval:g} s; Ctrl-C to quit)", flush=True)
        if not args.watch:
            return EXIT_OK
        try:
            time.sleep(args.interval)
        except KeyboardInterrupt:
            return EXIT_OK


def list_command(args) -> int:
    import ray

    from rayconnect.actors import names
    from rayconnect.actors.directory import get_actor

    if (code := _connect_or_exit(args.address)) is not None:
        return code
    by_pipeline: dict[str, list[str]] = {}
    for a in ray.util.list_named_actors(all_namespaces=True):
        if a["namespace"] == names.NAMESPACE and (p := names.pipeline_of(a["name"])):
            by_pipeline.setdefault(p, []).append(a["name"])
    rows = []
    for pipeline, actor_names in sorted(by_pipeline.items()):
        row: dict[str, Any] = {
            "name": pipeline,
            "actors": len(actor_names),
            "state": "-",
            "table": None,
        }
        coordinator = get_actor(names.coordinator(pipeline))
        row["kind"] = "sink" if coordinator is not None else None
        if coordinator is None and any(n.startswith(f"{pipeline}/task/") for n in actor_names):
            row.update(kind="source", **_source_row(pipeline))
        if coordinator is not None:
            try:
                s = ray.get(coordinator.status.remote(), timeout=10)
                row.update(
                    state=s.state,
                    table=s.table,
                    table_version=s.table_version,
                    partitions=len(s.partitions),
                )
            except Exception as e:
                row["state"] = f"unreachable ({type(e).__name__})"
        rows.append(row)
    if args.json:
        print(json.dumps(rows, default=str, indent=2))
        return EXIT_OK
    if not rows:
        print("no pipelines running")
        return EXIT_OK
    width = max(len(r["name"]) for r in rows + [{"name": "name"}])
    print(
        f"{'name':<{width}}  {'kind':<6}  {'state':<12}  {'actors':>6}  {'partitions':>10}  "
        "table / target"
    )
    for r in rows:
        print(
            f"{r['name']:<{width}}  {r.get('kind') or '-':<6}  {str(r['state']):<12}  "
            f"{r['actors']:>6}  {_n(r.get('partitions')):>10}  "
            f"{r.get('table') or r.get('target') or '-'}"
        )
    return EXIT_OK


def _source_row(pipeline: str) -> dict[str, Any]:
    """``list``'s columns for a source pipeline: task states, source partitions, records."""
    from rayconnect.pipelines.source import SourcePipelineHandle

    try:
        s = SourcePipelineHandle(pipeline).status(timeout_s=10)
    except Exception as e:
        return {"state": f"unreachable ({type(e).__name__})"}
    states = sorted({t.state for t in s.tasks.values()})
    return {
        "state": "/".join(states) or "-",
        "tasks": len(s.tasks),
        "partitions": sum(len(t.committed_offsets) for t in s.tasks.values()),
        "records_committed": s.records_committed,
        "transactions_committed": s.transactions_committed,
    }


def stop_command(args) -> int:
    from rayconnect.actors import names
    from rayconnect.actors.directory import get_actor, pipeline_actor_names
    from rayconnect.pipelines.sink import PipelineHandle

    if (code := _connect_or_exit(args.address)) is not None:
        return code
    if (mirror := find_mirror(args.name)) is not None:  # its two pipelines as one
        from rayconnect.cli.mirror import mirror_stop_command

        return mirror_stop_command(mirror, args)
    if get_actor(names.coordinator(args.name)) is None and pipeline_kind(args.name) == "source":
        return _stop_source(args)
    if get_actor(names.coordinator(args.name)) is None and not pipeline_actor_names(args.name):
        return _not_running(args.name)
    what = "committing one last round, then stopping" if args.commit else "stopping"
    print(f"rayconnect: {args.name}: {what}...", file=sys.stderr, flush=True)
    result = PipelineHandle(args.name).stop(commit=args.commit, timeout_s=args.timeout)
    if result.error:
        print(f"rayconnect: {args.name}: {result.error}", file=sys.stderr)
    offsets = result.final.offsets if result.final else {}
    print(
        f"stopped {args.name}: table version "
        f"{_n(result.final.table_version if result.final else None)}, "
        f"{len(offsets)} partitions, committed offsets "
        + (", ".join(f"{k}={v}" for k, v in sorted(offsets.items())) or "-")
    )
    return EXIT_OK


def snapshot_command(args) -> int:
    """``rayconnect snapshot NAME TABLE...``: the source (a mirror's) snapshots them again."""
    from rayconnect.errors import ConfigError
    from rayconnect.pipelines.source import SourcePipelineHandle

    if (code := _connect_or_exit(args.address)) is not None:
        return code
    mirror = find_mirror(args.name)
    source = mirror.source if mirror is not None else args.name
    if pipeline_kind(source) != "source":
        return _not_running(args.name)
    try:
        SourcePipelineHandle(source).snapshot(args.tables)
    except ConfigError as e:
        print(f"rayconnect: {args.name}: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{args.name}: snapshot of {', '.join(args.tables)} requested (read while streaming)")
    return EXIT_OK


def _stop_source(args) -> int:
    """Every task commits its open transaction (``connector``: aborts it) and ends; with
    ``--no-commit`` the tasks are ended at once (the next start aborts what they left open)."""
    from rayconnect.cli.run import kill_source
    from rayconnect.errors import PipelineError
    from rayconnect.pipelines.source import SourcePipelineHandle

    release = getattr(args, "release", False)
    if not args.commit and not release:
        print(f"rayconnect: {args.name}: stopping", file=sys.stderr, flush=True)
        kill_source(args.name)
        print(f"stopped {args.name}: open transactions not committed")
        return EXIT_OK
    print(
        f"rayconnect: {args.name}: committing open transactions, then stopping...",
        file=sys.stderr,
        flush=True,
    )
    try:
        final = SourcePipelineHandle(args.name).stop(timeout_s=args.timeout, release=release)
    except PipelineError as e:
        print(f"rayconnect: {e}", file=sys.stderr)
        return EXIT_FAILED
    final = redact(final)
    failed = False
    for actor_name, f in sorted(final.items()):
        if f.get("error"):
            failed = True
            print(f"rayconnect: {actor_name}: {f['error']}", file=sys.stderr)
    print(
        f"stopped {args.name}: {len(final)} task(s), "
        f"{sum(f.get('records_committed', 0) for f in final.values()):,} records in "
        f"{sum(f.get('transactions_committed', 0) for f in final.values()):,} transactions "
        "committed" + ("; the source released what it kept (replication slot)" if release else "")
    )
    return EXIT_FAILED if failed else EXIT_OK
