"""The CLI's help texts and exit codes, for everything that is decided before Ray starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from status_sample import pipeline_status

from rayconnect.cli import EXIT_OK, EXIT_REQUIREMENT, EXIT_USAGE, build_parser, main

pytestmark = [pytest.mark.timeout(30)]


@pytest.mark.parametrize("command", ["run", "list", "status", "stop", "demo"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == EXIT_OK
    out = capsys.readouterr().out
    assert f"usage: rayconnect {command}" in out and len(out) > 200


def test_top_level_help_lists_every_command():
    text = build_parser().format_help()
    for command in ("run", "list", "status", "stop", "demo"):
        assert command in text


def test_cli_module_documents_exit_codes():
    import rayconnect.cli as cli

    for code in ("0", "1", "2", "3", "4", "5"):
        assert f"\n  {code}  " in cli.__doc__


def test_bad_pipeline_file_exits_2_naming_file_and_field(tmp_path, capsys):
    f = tmp_path / "p.yaml"
    f.write_text("kind: sink\nname: x\nsource: {metadata: {streams: []}}\nsink: {path: /t}\n")
    assert main(["run", str(f)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{f}:3: $.source.metadata: metadata.streams: give at least one KafkaStream" in err


def test_missing_file_and_bad_arguments_exit_2(tmp_path, capsys):
    assert main(["run", str(tmp_path / "nope.yaml")]) == EXIT_USAGE
    with pytest.raises(SystemExit) as info:
        main(["status"])
    assert info.value.code == EXIT_USAGE
    with pytest.raises(SystemExit) as info:
        main(["status", "x", "--interval", "0"])
    assert info.value.code == EXIT_USAGE


def test_embedded_broker_cannot_detach(capsys):
    example = str(Path(__file__).parents[3] / "examples" / "orders-sink.yaml")
    assert main(["run", example, "--embedded-broker", "--detach"]) == EXIT_USAGE
    assert "cannot be combined with --detach" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["status", "x"], ["stop", "x"], ["list"]])
def test_no_ray_at_the_address_exits_3_at_once(command, capsys):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main([*command, "--address", f"127.0.0.1:{port}"]) == EXIT_REQUIREMENT
    assert "no Ray cluster" in capsys.readouterr().err


# -- source pipelines (kind: source) ---------------------------------------------------------

SOURCE_EXAMPLE = str(Path(__file__).parents[3] / "examples" / "numbers-source.yaml")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bad_source_file_exits_2_naming_file_and_field(tmp_path, capsys):
    f = tmp_path / "s.yaml"
    f.write_text(
        "kind: source\nname: s\ntask: {type: generator, topic: t, partitons: 2}\n"
        "target: {bootstrap_servers: 'h:9092'}\n"
    )
    assert main(["run", str(f)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"{f}:3: $.task.partitons: unknown field; did you mean 'partitions'?" in err


def test_source_file_with_missing_python_class_exits_2(tmp_path, capsys):
    f = tmp_path / "s.yaml"
    f.write_text(
        "kind: source\nname: s\ntask: {type: python, class: 'no_such_mod_x:Task'}\n"
        "target: {bootstrap_servers: 'h:9092'}\n"
    )
    assert main(["run", str(f)]) == EXIT_USAGE
    assert f"{f}:3: $.task: class 'no_such_mod_x:Task': cannot import" in capsys.readouterr().err


def test_source_embedded_broker_cannot_detach(capsys):
    assert main(["run", SOURCE_EXAMPLE, "--embedded-broker", "--detach"]) == EXIT_USAGE
    assert "cannot be combined with --detach" in capsys.readouterr().err


def test_unreachable_source_target_exits_2_before_ray(monkeypatch, capsys):
    import ray

    monkeypatch.setenv("KAFKA_BOOTSTRAP", f"127.0.0.1:{_free_port()}")
    assert main(["run", SOURCE_EXAMPLE, "--detach"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "$.target.bootstrap_servers: Kafka unreachable" in err
    assert not ray.is_initialized()


def test_source_task_that_cannot_be_built_exits_2_before_ray(tmp_path, monkeypatch, capsys):
    import socket

    import ray

    (tmp_path / "rc_cli_broken_task.py").write_text(
        "import rayconnect as rc\n\n\nclass Broken(rc.SourceTask):\n"
        "    def __init__(self, topic):\n        raise RuntimeError('no source')\n"
    )
    monkeypatch.setattr("sys.path", [str(tmp_path), *__import__("sys").path])
    with socket.socket() as server:  # a "broker" that accepts connections
        server.bind(("127.0.0.1", 0))
        server.listen()
        f = tmp_path / "s.yaml"
        f.write_text(
            "kind: source\nname: s\n"
            "task: {type: python, class: 'rc_cli_broken_task:Broken', args: {topic: t}}\n"
            f"target: {{bootstrap_servers: '127.0.0.1:{server.getsockname()[1]}'}}\n"
        )
        assert main(["run", str(f)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "$.task: rc_cli_broken_task:Broken(**args) failed: RuntimeError: no source" in err
    assert not ray.is_initialized()


class _FakeSourceHandle:
    """Counts records up on every status(); ``on_status(n)`` runs at the n-th call."""

    name = "numbers"

    def __init__(self, on_status=None) -> None:
        self.calls, self.stopped, self.on_status = 0, False, on_status or (lambda n: None)

    def status(self, **task_fields):
        from rayconnect.protocol.source_status import SourceTaskReport, summed

        self.calls += 1
        self.on_status(self.calls)
        n = 100 * self.calls
        task = SourceTaskReport(
            task=0,
            state="polling",
            records_committed=n,
            transactions_committed=self.calls,
            transactions_aborted=0,
            committed_offsets={'{"generator":0}': {"seq": n - 1}},
            **task_fields,
        )
        return summed(self.name, {0: task})

    def stop(self, timeout_s: float = 60.0):
        import msgspec

        self.stopped = True
        s = self.status().tasks[0]
        return {"numbers/task/0": msgspec.structs.replace(s, state="closed")}


def test_source_foreground_stops_cleanly_on_sigint(capsys):
    import os
    import signal

    from rayconnect.cli.run import source_loop
    from rayconnect.cli.stop_signals import stop_signals

    before = signal.getsignal(signal.SIGINT)
    handle = _FakeSourceHandle(lambda n: n == 3 and os.kill(os.getpid(), signal.SIGINT))
    with stop_signals() as stop_requested:
        assert source_loop(handle, 0.01, stop_requested) == EXIT_OK
    assert signal.getsignal(signal.SIGINT) is before  # handlers restored
    out = capsys.readouterr().out
    assert handle.stopped
    assert "numbers: 1 task(s) polling, transactions 2 committed / 0 aborted, records 200" in out
    assert "SIGINT: committing open transactions, then stopping..." in out
    assert "stopped numbers: 1 task(s), 400 records in 4 transactions committed" in out


def test_one_signal_delivered_twice_is_one_stop_a_later_second_stops_at_once():
    """``timeout`` delivers its SIGTERM to the command and to its group: two within
    milliseconds are one stop; a second signal after SAME_STOP_WITHIN_S is a second Ctrl-C."""
    import os
    import signal
    import time

    import pytest

    from rayconnect.cli.stop_signals import SAME_STOP_WITHIN_S, stop_signals

    with stop_signals() as stop_requested:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # the handlers run
        assert stop_requested == ["SIGTERM"]
        time.sleep(SAME_STOP_WITHIN_S)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)


def test_source_foreground_notices_a_stop_from_elsewhere(capsys):
    from rayconnect.cli.run import source_loop

    class Gone(_FakeSourceHandle):
        def status(self):
            from rayconnect.protocol.source_status import summed

            return summed(self.name, {})

    assert source_loop(Gone(), 0.01, []) == EXIT_OK
    assert "pipeline 'numbers' was stopped" in capsys.readouterr().out


def test_source_status_renders_tasks_without_secrets():
    import msgspec

    from rayconnect.cli.status import render_status
    from rayconnect.protocol.source_status import SourceLag, SourcePipelineStatus
    from rayconnect.protocol.status import ActorStatus
    from rayconnect.redact import redact

    status = _FakeSourceHandle().status(
        last_error="KafkaConnectionError: broker down",
        warning="exactly-once disabled (at-least-once): no transactions",
        source={"slot": "s", "sasl.plain.password": "hunter2"},
        lag=SourceLag(bytes=4096, seconds=1.5),
    )
    actor = ActorStatus(name="numbers/task/0", state="ALIVE", pid=7, node=None, restarts=1)
    status = msgspec.structs.replace(status, actors=(actor,))
    redacted = msgspec.convert(redact(status), SourcePipelineStatus, strict=False)
    assert redacted.tasks[0].source == {"slot": "s", "sasl.plain.password": "***"}
    text = render_status(redacted)
    assert "source pipeline numbers  tasks 1  records committed 100" in text
    assert "warning: exactly-once disabled" in text
    assert "KafkaConnectionError: broker down" in text and "numbers/task/0" in text
    assert "4,096 B / 1.5 s" in text
    assert "hunter2" not in text


def test_embedded_s3_cannot_detach_and_is_for_sink_pipelines(capsys):
    example = str(Path(__file__).parents[3] / "examples" / "orders-sink.yaml")
    assert main(["run", example, "--embedded-s3", "--detach"]) == EXIT_USAGE
    assert "--embedded-s3 cannot be combined with --detach" in capsys.readouterr().err
    assert main(["run", SOURCE_EXAMPLE, "--embedded-s3"]) == EXIT_USAGE
    assert "--embedded-s3 is for sink pipelines" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("path", "table"),
    [("/data/orders", "s3://rayconnect/orders"), ("s3://lake/t/orders", "s3://lake/t/orders")],
)
def test_embedded_s3_table_keeps_the_file_s_bucket_or_uses_rayconnect(path, table):
    import rayconnect as rc
    from rayconnect.cli.run import _embedded_s3_table

    meta = rc.StaticMetadataService(
        (rc.KafkaStream("o", {"c": rc.ClusterMetadata("h:9092", ("o",))}),)
    )
    config = rc.SinkPipeline("p", rc.KafkaSource(meta), rc.DeltaSink(path)).config
    assert _embedded_s3_table(config).uri == table


def test_run_exits_5_with_the_reason_when_the_pipeline_gives_up(capsys):
    """Sink and source: ``run`` prints why, stops the pipeline, and exits 5."""
    from argparse import Namespace

    from rayconnect.cli import EXIT_GAVE_UP
    from rayconnect.cli.run import _sink_loop, source_loop

    reason = "gave up: table store failing for 900 s without a break (give_up_after_s=900): x"

    class GaveUpSink:
        name, stopped = "orders", None

        def status(self):
            return pipeline_status(gave_up=reason)

        def stop(self, commit=True):
            self.stopped = commit

    sink = GaveUpSink()
    args = Namespace(interval=0.01, demo_rate=0)
    assert _sink_loop(sink, args, None, []) == EXIT_GAVE_UP
    assert sink.stopped is False  # stopped without a last round: the table is unreachable
    captured = capsys.readouterr()
    assert f"orders: {reason}" in captured.err
    assert "pipeline 'orders' gave up; stopping it" in captured.out

    class GaveUpSource(_FakeSourceHandle):
        def status(self):
            return super().status(gave_up=reason)

    source = GaveUpSource(lambda n: None)
    assert source_loop(source, 0.01, []) == EXIT_GAVE_UP
    assert source.stopped
    assert f"numbers: {reason}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("writer", "line"),
    [
        ({"executors": None, "executors_wanted": 2}, "spark executors - of 2  starting Spark"),
        ({"executors": 2, "executors_wanted": 2}, "spark executors 2 of 2  ok"),
        (
            {"executors": 1, "executors_wanted": 2, "problem": "degraded: 1 of 2 Spark executors"},
            "spark executors 1 of 2  degraded: 1 of 2 Spark executors",
        ),
        ({"error": "RayActorError: restarting"}, "spark executors - of -  RayActorError"),
        (
            {"executors": None, "executors_wanted": 1, "spark_start": "when_needed"},
            "spark executors - of 1  Spark not started: the writer's process writes until it "
            "is busy (when_needed)",
        ),
        (
            {
                "executors": None,
                "executors_wanted": 1,
                "spark_start": "when_needed",
                "spark_started_because": "writes in the writer's process took 17 s of 20 s",
            },
            "spark executors - of 1  starting Spark",
        ),
    ],
)
def test_sink_status_says_how_many_spark_executors_run(writer, line):
    from rayconnect.cli.status import render_status

    assert line in render_status(pipeline_status(writer=writer, actors=()))


def test_sink_status_shows_table_upkeep():
    from rayconnect.cli.status import render_status

    upkeep = {
        "compactions": 3,
        "compactions_given_up": 1,
        "tidies": 2,
        "tidies_failed": 0,
        "files_since_compaction": 40,
        "running": [],
        "last_error": "compact: CommitFailedError: lost to a DELETE",
    }
    text = render_status(pipeline_status(upkeep=upkeep))
    assert (
        "table upkeep: 3 compactions (1 given up), 2 tidies (0 failed), 40 files since the "
        "last compaction; last error: compact: CommitFailedError: lost to a DELETE"
    ) in text


def test_sink_status_counts_dead_letters_per_partition():
    from rayconnect.cli.status import render_status

    status = pipeline_status(dead_letters={"local/orders/0": 3, "local/orders/1": 1200})
    assert "dead letters 1,203 in the table (local/orders/0=3, local/orders/1=1,200)" in (
        render_status(status)
    )


def test_sink_status_shows_the_committed_cut_and_a_partition_without_cut_markers():
    """Consistent cuts: the last cut committed, and a partition whose records no marker
    follows (the source writes none) - in ``status``, ``status --watch`` and the mirror's
    live lines."""
    from rayconnect.cli.mirror import mirror_lines
    from rayconnect.cli.status import render_status
    from rayconnect.pipelines.mirror import MirrorStatus

    why = "consistent cuts: 5 records held past offset 0 and no cut marker read after them"
    part = {"committed_offset": None, "high_watermark": 5, "lag": None, "host": None}
    status = pipeline_status(
        committed_cut=4242,
        partition_status={"c/t/0": {**part, "state": "no_cut_markers", "reason": why}},
    )
    text = render_status(status)
    assert "committed cut: LSN 4242" in text
    assert f"c/t/0: no_cut_markers: {why}" in text and "NO_CUT_MARKERS" in text
    lines = mirror_lines(MirrorStatus(name="m", source=None, sink=status))
    assert f"  sink c/t/0: no_cut_markers: {why}" in lines
    assert "committed cut" not in render_status(pipeline_status())  # cuts off


def test_a_recovered_source_task_shows_no_error_now_and_the_one_it_recovered_from():
    """Issue 38: an error that ended an earlier incarnation is history once the task
    started again - not its state - and status says so, with the time."""
    from rayconnect.cli.status import render_status
    from rayconnect.protocol.source_status import (
        ERROR_HISTORY,
        PastError,
        current_error,
        with_error,
    )

    down = PastError(error="the database system is not yet accepting connections", at=1.0)
    assert current_error(None, (down,), started=False) == down.error  # still starting
    assert current_error(None, (down,), started=True) is None  # recovered
    assert current_error("fenced", (down,), started=True) == "fenced"  # its own: now
    assert current_error(None, (), started=False) is None
    history: tuple[PastError, ...] = ()
    for i in range(ERROR_HISTORY + 2):
        history = with_error(history, PastError(error=f"e{i}", at=float(i)))
    assert [e.error for e in history] == [f"e{i}" for i in range(2, ERROR_HISTORY + 2)]
    text = render_status(_FakeSourceHandle().status(errors=(down,)))
    assert "none now (recovered from 'the database system is not yet accepting" in text


def test_a_down_source_task_shows_the_slots_lag_without_seconds():
    """The lag Postgres counts for a task that is not streaming has no age: none shown."""
    from rayconnect.cli.status import render_status
    from rayconnect.protocol.source_status import SourceLag

    text = render_status(_FakeSourceHandle().status(lag=SourceLag(bytes=81920)))
    assert "81,920 B" in text and "81,920 B /" not in text
