"""One root exception under every error a user may catch, and exit codes chosen by an
error's type alone (never by its message)."""

from __future__ import annotations

import inspect

import pytest

import rayconnect as rc
import rayconnect.errors
from rayconnect.cli.exit_codes import (
    EXIT_FAILED,
    EXIT_NOT_FOUND,
    EXIT_REQUIREMENT,
    EXIT_USAGE,
    exit_code,
)
from rayconnect.cli.pipeline_file import PipelineFileError
from rayconnect.cli.run import _failed
from rayconnect.demo.sink import DemoError
from rayconnect.kafka.embedded import BrokerStartError
from rayconnect.protocol.streams import MetadataError
from rayconnect.storage.embedded_s3 import S3StartError
from rayconnect.storage.location import StorageError


def test_every_error_of_the_errors_module_and_the_api_derives_from_the_root() -> None:
    errors = [
        cls
        for _, cls in inspect.getmembers(rayconnect.errors, inspect.isclass)
        if issubclass(cls, BaseException)
    ]
    exported = [getattr(rc, n) for n in rc.__all__ if n.endswith("Error")]
    others = [StorageError, MetadataError, BrokerStartError, S3StartError, DemoError]
    assert rc.RayconnectError is rayconnect.errors.RayconnectError
    assert [c for c in [*errors, *exported, *others] if not issubclass(c, rc.RayconnectError)] == []


def test_the_builtin_bases_stay_so_existing_except_clauses_still_catch() -> None:
    assert issubclass(rc.ConfigError, ValueError)
    assert issubclass(rc.PipelineNotFoundError, rc.PipelineError)
    assert issubclass(rc.PipelineAlreadyRunningError, RuntimeError)
    assert issubclass(rc.RayUnavailableError, ConnectionError)


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (rc.ConfigError("x"), EXIT_USAGE),
        (PipelineFileError("p.yaml", "$.name", "x", line=3), EXIT_USAGE),  # a subclass: its parent's code
        (rc.DiscoveryError("x"), EXIT_USAGE),
        (rc.PipelineError("exactly_once='required' but no transactions"), EXIT_USAGE),
        (rc.JavaNotFoundError("x"), EXIT_REQUIREMENT),
        (rc.RayUnavailableError("x"), EXIT_REQUIREMENT),
        (rc.PipelineNotFoundError("x"), EXIT_NOT_FOUND),
        (rc.PipelineAlreadyRunningError("x"), EXIT_NOT_FOUND),
        (StorageError("x"), EXIT_USAGE),
        (MetadataError("x"), EXIT_USAGE),
        (S3StartError("x"), EXIT_FAILED),
        (rc.RayconnectError("x"), EXIT_FAILED),
        (RuntimeError("already running"), EXIT_FAILED),  # not ours: the text does not count
    ],
)
def test_exit_code_follows_the_type(error: BaseException, code: int) -> None:
    assert exit_code(error) == code


def test_run_picks_the_code_by_type_not_by_the_words_already_running(capsys) -> None:
    assert _failed(rc.PipelineAlreadyRunningError("'orders' runs (since 12:00)"), "p.yaml") == 4
    assert capsys.readouterr().err == "rayconnect: 'orders' runs (since 12:00)\n"
    assert _failed(rc.PipelineError("already running, says a message"), "p.yaml") == EXIT_USAGE
    assert _failed(rc.DiscoveryError("topic 'x' missing"), "p.yaml") == EXIT_USAGE
    assert capsys.readouterr().err.endswith("rayconnect: p.yaml: topic 'x' missing\n")
