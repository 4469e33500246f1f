"""What consistent cuts cost in freshness (issue 40.3): Postgres commit -> visible, p50/p99,
with ``commit.consistent_cuts`` off (each table read at its newest version) and on (the
tables read at ``pick_cut``'s versions: visible once the cut holding the row is readable in
every table), in the same run, the same load.

A real Postgres 15, an embedded broker per setting, a local Ray; a mirror of two tables
(2 partitions each, the mirror's defaults: ``commit_interval_s`` 5) under ``--rate``
transactions/s for ``--seconds``, each inserting one row into both tables (``changed_ms``:
the writer's clock at the statement). Visibility is read from the Delta logs afterwards:
off, the commit time of the first version holding the row; on, the first commit time at
which the cut every table reached (``pick_cut`` over the versions committed by then) holds
the row in its table.

    .venv/bin/python bench/consistent_cuts.py [--rate 200] [--seconds 60] [--interval 5]

Prints a markdown table and writes it to ``bench/results/consistent-cuts/``.
"""

from __future__ import annotations

import argparse
import bisect
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import unquote

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RaySession, cleanup_private_tmp, percentiles  # noqa: E402

import rayconnect as rc  # noqa: E402
from rayconnect.demo.local_postgres import PostgresServer, postgres_server  # noqa: E402
from rayconnect.protocol.effects import CUT_LSN_KEY  # noqa: E402
from rayconnect.tables.consistent_cut import pick_cut  # noqa: E402

OUT = Path(__file__).resolve().parent / "results" / "consistent-cuts"
TABLES = ("cut_a", "cut_b")


def execute(server: PostgresServer, *statements: str) -> None:
    import psycopg2

    conn = psycopg2.connect(server.url, password=Path(server.password_file).read_text().strip())
    try:
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql)
        conn.commit()
    finally:
        conn.close()


def paced_inserts(
    server: PostgresServer, tables: tuple[str, ...], rate: int, seconds: float
) -> int:
    """``rate`` transactions/s, each one row into both tables; returns how many."""
    import psycopg2

    conn = psycopg2.connect(server.url, password=Path(server.password_file).read_text().strip())
    n, start = 0, time.monotonic()
    try:
        with conn.cursor() as cur:
            while (now := time.monotonic()) - start < seconds:
                due = start + n / rate
                if now < due:
                    time.sleep(due - now)
                ms = int(time.time() * 1000)
                for t in tables:
                    cur.execute(f"INSERT INTO {t} VALUES (%s, %s)", (n, ms))
                conn.commit()
                n += 1
    finally:
        conn.close()
    return n


def versions(path: Path) -> list[tuple[int, float, int | None, list[str]]]:
    """[(version, commit time s, cut or None, added files)] of a Delta table, in order."""
    from common import delta_visibility
    from deltalake import DeltaTable

    cuts = {h["version"]: h.get(CUT_LSN_KEY) for h in DeltaTable(str(path)).history()}
    return [
        (v, t, None if cuts.get(v) is None else int(cuts[v]), adds)
        for v, t, adds in delta_visibility(str(path))
    ]


def row_versions(
    path: Path, log: list[tuple[int, float, int | None, list[str]]]
) -> dict[int, tuple[int, int]]:
    """id -> (first version holding it, changed_ms)."""
    import pyarrow.parquet as pq

    first: dict[int, tuple[int, int]] = {}
    for version, _, _, adds in log:
        for rel in adds:
            data = pq.read_table(path / unquote(rel), columns=["id", "changed_ms"])
            for key, ms in zip(data["id"].to_pylist(), data["changed_ms"].to_pylist(), strict=True):
                first.setdefault(key, (version, ms))
    return first


def freshness(lake: Path, tables: tuple[str, ...], cuts: bool) -> list[float]:
    logs = {t: versions(lake / t) for t in tables}
    rows = {t: row_versions(lake / t, logs[t]) for t in tables}
    out: list[float] = []
    if not cuts:
        for t in tables:
            when = {v: c for v, c, _, _ in logs[t]}
            out += [when[v] * 1000 - ms for v, ms in rows[t].values()]
        return out
    # the cut view: at each commit time, the versions pick_cut gives over what was committed
    times = sorted({c for log in logs.values() for _, c, _, _ in log})
    picked: dict[str, list[tuple[float, int]]] = {t: [] for t in tables}
    for at in times:
        histories = {t: [(v, cut) for v, c, cut, _ in logs[t] if c <= at] for t in tables}
        try:
            chosen = pick_cut(histories)
        except Exception:
            continue
        for t in tables:
            picked[t].append((at, chosen.versions[t]))
    for t in tables:
        marks = [v for _, v in picked[t]]  # non-decreasing
        for version, ms in rows[t].values():
            i = bisect.bisect_left(marks, version)
            if i < len(marks):
                out.append(picked[t][i][0] * 1000 - ms)
    return out


def one_setting(server: PostgresServer, root: Path, cuts: bool, rate: int, seconds: int,
                interval: float) -> dict[str, Any]:  # fmt: skip
    name = "cuts-on" if cuts else "cuts-off"
    tables = tuple(name.replace("-", "_") + "_" + t for t in TABLES)
    execute(server, *(f"CREATE TABLE {t} (id int PRIMARY KEY, changed_ms bigint)" for t in tables))
    lake = root / name
    handle = rc.Mirror(
        name,
        server.url,
        to=str(lake),
        tables=list(tables),
        password_file=server.password_file,
        commit=rc.CommitSettings(commit_interval_s=interval, consistent_cuts=cuts),
    ).start()
    try:
        time.sleep(10)  # started, first rounds done
        count = paced_inserts(server, tables, rate, seconds)
        deadline = time.monotonic() + 180
        while True:  # every row in both tables
            done = all(
                (lake / t / "_delta_log").exists()
                and len(row_versions(lake / t, versions(lake / t))) >= count
                for t in tables
            )
            if done or time.monotonic() > deadline:
                break
            time.sleep(2)
        time.sleep(2 * interval)  # the cut that holds the last rows, in both tables
    finally:
        handle.stop()
    ms = freshness(lake, tables, cuts)
    p = percentiles(ms, (50, 99))
    return {"setting": name, "rows": len(ms), "transactions": count,
            "p50_ms": round(p["p50"]), "p99_ms": round(p["p99"]), "max_ms": round(max(ms))}  # fmt: skip


def main(rate: int, seconds: int, interval: float) -> None:
    root = Path(tempfile.mkdtemp(prefix="cuts-bench-"))
    results = []
    try:
        with postgres_server() as server, RaySession():
            for cuts in (False, True):
                results.append(one_setting(server, root, cuts, rate, seconds, interval))
    finally:
        shutil.rmtree(root, ignore_errors=True)
        cleanup_private_tmp()
    lines = [
        f"Consistent cuts' freshness cost: a mirror of 2 tables (2 partitions each), "
        f"{rate} transactions/s of one insert into each for {seconds} s, commit_interval_s "
        f"{interval}; Postgres commit -> visible (off: the table's newest version; on: the cut "
        f"every table reached)",
        "",
        "| consistent_cuts | rows | p50 | p99 | max |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['setting']} | {r['rows']:,} | {r['p50_ms']:,} ms | {r['p99_ms']:,} ms | "
            f"{r['max_ms']:,} ms |"
        )
    text = "\n".join(lines)
    print("\n" + text)
    OUT.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M")
    (OUT / f"cuts-{stamp}.md").write_text(text + "\n")
    (OUT / f"cuts-{stamp}.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=200)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--interval", type=float, default=5.0)
    args = ap.parse_args()
    main(args.rate, args.seconds, args.interval)
