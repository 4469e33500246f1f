"""``rayconnect list``, ``status NAME [--watch] [--json]`` and ``stop NAME``."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from rayconnect.commands import EXIT_NOT_FOUND, EXIT_OK, EXIT_REQUIREMENT, connect
from rayconnect.redact import redact


def _actors(pipeline: str) -> list[dict[str, Any]]:
    """The pipeline's actors with their state (ALIVE, RESTARTING, ...), pid and restarts."""
    import ray

    from rayconnect.actors import names
    from rayconnect.api import pipeline_actor_names

    wanted = pipeline_actor_names(pipeline)
    try:
        from ray.util.state import list_actors

        found = {
            a.name: a
            for a in list_actors(
                address=ray.get_runtime_context().gcs_address,  # never guess among clusters
                filters=[("ray_namespace", "=", names.NAMESPACE)],
                limit=10_000,
                timeout=10,
                detail=True,
            )
            if a.name in wanted and a.state != "DEAD"
        }
    except Exception:  # state API unavailable (no dashboard): names only
        found = {}
    out = []
    for name in wanted:
        a = found.get(name)
        out.append(
            {
                "name": name,
                "state": getattr(a, "state", "?"),
                "pid": getattr(a, "pid", None),
                "node": (getattr(a, "node_id", None) or "")[:8] or None,
                "restarts": getattr(a, "num_restarts", None),
            }
        )
    return out


def pipeline_status(name: str) -> dict[str, Any]:
    """Everything ``status`` shows, as one JSON-able dict, credentials masked."""
    from rayconnect.api import PipelineHandle

    status = PipelineHandle(name).status()
    hws: dict[str, int | None] = {}
    for reader in status.get("readers", {}).values():
        for key, p in reader.get("partitions", {}).items():
            hws[key] = p.get("high_watermark")
    partitions = {}
    keys = sorted(set(status.get("partitions") or ()) | set(status.get("offsets", {})) | set(hws))
    for key in keys:
        partitions[key] = {
            "committed_offset": status.get("offsets", {}).get(key),
            "high_watermark": hws.get(key),
            "lag": status.get("lag", {}).get(key),
        }
    status["partition_status"] = partitions
    status["actors"] = _actors(name)
    return redact(status)


def _n(value: Any) -> str:
    return "-" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def render_status(s: dict[str, Any]) -> str:
    lines = []
    total_lag = sum(p["lag"] or 0 for p in s["partition_status"].values())
    lines.append(
        f"pipeline {s.get('pipeline')}  state {s.get('state')}  epoch {s.get('epoch')}  "
        f"table version {_n(s.get('table_version'))}  ({s.get('table')})"
    )
    last = s.get("last_round_duration_s")
    lines.append(
        f"round {s.get('txn_id')}  last round {'-' if last is None else f'{last:.2f} s'}  "
        f"median {_fmt_s(s.get('round_s_median'))}  max {_fmt_s(s.get('round_s_max'))}  "
        f"commit median {_fmt_s(s.get('commit_s_median'))}"
    )
    lines.append(
        f"rounds committed {s.get('rounds_committed')} (partial {s.get('rounds_partial')})  "
        f"discarded {s.get('rounds_discarded')}  empty {s.get('rounds_empty')}  "
        f"records committed {_n(s.get('records_committed'))}  lag {total_lag:,}"
    )
    for label in ("fenced", "error", "last_error"):
        if s.get(label):
            lines.append(f"{label}: {s[label]}")
    lines.append("")
    width = max([len(k) for k in s["partition_status"]] + [9])
    lines.append(f"{'partition':<{width}}  {'committed':>12}  {'high water':>12}  {'lag':>10}")
    for key, p in s["partition_status"].items():
        lines.append(
            f"{key:<{width}}  {_n(p['committed_offset']):>12}  {_n(p['high_watermark']):>12}  "
            f"{_n(p['lag']):>10}"
        )
    lines.append("")
    width = max([len(a["name"]) for a in s["actors"]] + [5])
    lines.append(f"{'actor':<{width}}  {'state':<11}  {'pid':>8}  {'restarts':>8}")
    for a in s["actors"]:
        lines.append(
            f"{a['name']:<{width}}  {a['state']:<11}  {_n(a['pid']):>8}  {_n(a['restarts']):>8}"
        )
    return "\n".join(lines)


def _fmt_s(v: Any) -> str:
    return "-" if v is None else f"{v:.2f} s"


def _not_running(name: str) -> int:
    print(f"rayconnect: no running pipeline named {name!r} (see: rayconnect list)", file=sys.stderr)
    return EXIT_NOT_FOUND


def _connect_or_exit(address: str | None) -> int | None:
    try:
        connect(address)
    except (ConnectionError, RuntimeError) as e:
        print(
            f"rayconnect: no Ray cluster at {address or 'auto'} ({e}); start one with "
            "`ray start --head` or pass --address",
            file=sys.stderr,
        )
        return EXIT_REQUIREMENT
    return None


def status_command(args) -> int:
    from rayconnect.actors import names
    from rayconnect.api import PipelineError, _get_actor

    if (code := _connect_or_exit(args.address)) is not None:
        return code
    while True:
        if _get_actor(names.coordinator(args.name)) is None:
            return _not_running(args.name)
        try:
            s = pipeline_status(args.name)
        except PipelineError:
            return _not_running(args.name)
        if args.json:
            print(json.dumps(s, default=str, indent=None if args.watch else 2), flush=True)
        else:
            if args.watch and sys.stdout.isatty():
                print("\x1b[2J\x1b[H", end="")
            print(render_status(s), flush=True)
            if args.watch:
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
    from rayconnect.api import _get_actor

    if (code := _connect_or_exit(args.address)) is not None:
        return code
    by_pipeline: dict[str, list[str]] = {}
    for a in ray.util.list_named_actors(all_namespaces=True):
        if a["namespace"] == names.NAMESPACE and (p := names.pipeline_of(a["name"])):
            by_pipeline.setdefault(p, []).append(a["name"])
    rows = []
    for pipeline, actor_names in sorted(by_pipeline.items()):
        row = {"name": pipeline, "actors": len(actor_names), "state": "-", "table": None}
        coordinator = _get_actor(names.coordinator(pipeline))
        if coordinator is not None:
            try:
                s = ray.get(coordinator.status.remote(), timeout=10)
                row.update(
                    state=s.get("state"),
                    table=s.get("table"),
                    table_version=s.get("table_version"),
                    partitions=len(s.get("partitions") or ()),
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
    print(f"{'name':<{width}}  {'state':<12}  {'actors':>6}  {'partitions':>10}  table")
    for r in rows:
        print(
            f"{r['name']:<{width}}  {str(r['state']):<12}  {r['actors']:>6}  "
            f"{_n(r.get('partitions')):>10}  {r.get('table') or '-'}"
        )
    return EXIT_OK


def stop_command(args) -> int:
    from rayconnect.actors import names
    from rayconnect.api import PipelineHandle, _get_actor, pipeline_actor_names

    if (code := _connect_or_exit(args.address)) is not None:
        return code
    if _get_actor(names.coordinator(args.name)) is None and not pipeline_actor_names(args.name):
        return _not_running(args.name)
    what = "committing one last round, then stopping" if args.commit else "stopping"
    print(f"rayconnect: {args.name}: {what}...", file=sys.stderr, flush=True)
    final = PipelineHandle(args.name).stop(commit=args.commit, timeout_s=args.timeout)
    final = redact(final)
    if final.get("error"):
        print(f"rayconnect: {args.name}: {final['error']}", file=sys.stderr)
    offsets = final.get("offsets") or {}
    print(
        f"stopped {args.name}: table version {_n(final.get('table_version'))}, "
        f"{len(offsets)} partitions, committed offsets "
        + (", ".join(f"{k}={v}" for k, v in sorted(offsets.items())) or "-")
    )
    return EXIT_OK
