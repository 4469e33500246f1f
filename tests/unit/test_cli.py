"""The CLI's help texts and exit codes, for everything that is decided before Ray starts."""

from __future__ import annotations

from pathlib import Path

import pytest

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

    for code in ("0", "1", "2", "3", "4"):
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
    example = str(Path(__file__).parents[2] / "examples" / "orders-sink.yaml")
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
