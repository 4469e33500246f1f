"""Settings of a source pipeline, checked when built (before any actor starts).

Names follow Kafka 3.3's KIP-618 settings: ``exactly_once`` ~ ``exactly.once.support``
(requested / required), ``transaction_boundary`` ~ ``transaction.boundary`` (poll /
interval / connector), ``offsets_topic`` ~ ``offsets.storage.topic``; ``group`` plays the
role of the Connect group id in ``transactional_id = <group>-<pipeline>-<task>``.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import sys
from pathlib import Path
from typing import Any, ClassVar, Literal

import msgspec

from rayconnect.errors import ConfigError
from rayconnect.properties import check_client_properties
from rayconnect.protocol.outages import DEFAULT_GIVE_UP_AFTER_S
from rayconnect.protocol.source_task import BOUNDARIES, Boundary
from rayconnect.protocol.types import check_name
from rayconnect.redact import redacted_repr
from rayconnect.settings_types import PositiveFloat, PositiveInt
from rayconnect.source_tasks.base import ConfiguredTask, SourceTask, check_topic
from rayconnect.source_tasks.delta import DeltaTableSettings, DeltaTableSource
from rayconnect.source_tasks.files import FileSource, FileSourceSettings
from rayconnect.source_tasks.generator import GeneratorSettings, GeneratorSource
from rayconnect.source_tasks.postgres import PostgresSettings, PostgresSource

ExactlyOnce = Literal["requested", "required"]
GLOBAL_OFFSETS_TOPIC = "rayconnect-offsets"


def default_offsets_topic(pipeline: str) -> str:
    return f"{GLOBAL_OFFSETS_TOPIC}-{pipeline}"


class KafkaTarget(msgspec.Struct, frozen=True):
    """The cluster a source pipeline writes to (its offsets topics live there too).
    ``properties`` are Kafka client properties (``security.protocol``...)."""

    #: the cluster a source pipeline writes to (its offsets topics live there too)
    bootstrap_servers: str
    #: Kafka client properties (``security.protocol``...); masked in status, logs and reprs
    properties: dict[str, str] = {}

    __repr__ = redacted_repr  # properties hold credentials

    def __post_init__(self) -> None:
        if not self.bootstrap_servers:
            raise ConfigError("target.bootstrap_servers is empty")
        for problem in check_client_properties(self.properties):
            raise ConfigError(f"properties: {problem}")


class SourceSettings(msgspec.Struct, frozen=True, kw_only=True):
    """A source pipeline's settings, the task aside. Checked when built - by
    ``rc.SourcePipeline`` and, with the task, by a ``kind: source`` pipeline file (which
    extends this Struct) - and every error starts with the field's name."""

    #: the pipeline's name: tasks are ``<name>/task/<i>``
    name: str
    #: the Kafka cluster written to
    target: KafkaTarget
    #: task actors; source partitions are split over them by ``crc32(partition) % tasks``
    tasks: PositiveInt = 1
    #: the pipeline's own offsets topic; None: ``rayconnect-offsets-<name>``
    offsets_topic: str | None = None
    #: read after the pipeline's own offsets topic (KIP-618's global topic)
    global_offsets_topic: str = GLOBAL_OFFSETS_TOPIC
    #: when a task commits its transaction: after every ``poll``, every ``interval``, or when the task
    #: says (``connector``)
    transaction_boundary: Boundary = "poll"
    #: the interval of ``transaction_boundary: interval``
    transaction_boundary_interval_s: PositiveFloat = 1.0
    #: ``required``: refuse to start when the target has no transactions; ``requested``: go on at
    #: least once
    exactly_once: ExactlyOnce = "requested"
    #: first part of each task's ``transactional_id`` (``<group>-<name>-<task>``)
    group: str = "rayconnect"
    #: how long a commit (or init) may take before the task fails (seed 000's max.block.ms)
    commit_timeout_s: PositiveFloat = 30.0
    #: Kafka producer properties of every task
    producer_properties: dict[str, str] = {}
    #: where records that cannot be written go (Kafka Connect's errors.deadletterqueue),
    #: in the same transaction as the rest; None: such a record fails the task, which then
    #: stays failed with the reason (a restart would only meet the same record again)
    dead_letter_topic: str | None = None
    #: seconds a task may fail without a break (the target unreachable: every restart fails
    #: again) before it gives up and stays failed with the reason; None: retry for ever
    give_up_after_s: float | None = DEFAULT_GIVE_UP_AFTER_S

    __repr__ = redacted_repr  # the target's properties hold credentials

    def __post_init__(self) -> None:
        try:
            check_name("pipeline name", self.name)
        except ValueError as e:
            raise ConfigError(f"name: {e}") from None
        for field, topic in (
            ("offsets_topic", self.offsets_topic),
            ("global_offsets_topic", self.global_offsets_topic),
            ("dead_letter_topic", self.dead_letter_topic),
        ):
            if topic is not None:
                check_topic(field, topic)
        if self.tasks < 1:
            raise ConfigError("tasks: must be >= 1")
        if self.transaction_boundary not in BOUNDARIES:
            raise ConfigError(
                f"transaction_boundary: must be one of {BOUNDARIES}, not "
                f"{self.transaction_boundary!r}"
            )
        if self.transaction_boundary_interval_s <= 0:
            raise ConfigError("transaction_boundary_interval_s: must be > 0")
        if self.exactly_once not in ("requested", "required"):
            raise ConfigError(
                f"exactly_once: must be 'requested' or 'required', not {self.exactly_once!r}"
            )
        if not self.group:
            raise ConfigError("group: must not be empty")
        if self.commit_timeout_s <= 0:
            raise ConfigError("commit_timeout_s: must be > 0")
        for problem in check_client_properties(self.producer_properties):
            raise ConfigError(f"producer_properties: {problem}")
        if self.give_up_after_s is not None and self.give_up_after_s <= 0:
            raise ConfigError(
                "give_up_after_s: must be > 0 (seconds), or null to retry for ever, "
                f"not {self.give_up_after_s!r}"
            )

    @property
    def own_offsets_topic(self) -> str:
        return self.offsets_topic or default_offsets_topic(self.name)

    def transactional_id(self, task: int) -> str:
        return f"{self.group}-{self.name}-{task}"


# -- pipeline files (``kind: source``) --------------------------------------------------------
#
# The task of a source pipeline is a Python object; a pipeline file names it with a tagged
# ``task: {type: ...}`` mapping instead: one Struct per built-in source, with exactly the
# parameters of its constructor, plus ``python`` for any SourceTask subclass by import path.


class TaskConfig(msgspec.Struct, frozen=True, tag_field="type"):
    """Base of the ``task:`` choices; ``type`` names one and, unlike ``source.metadata``'s,
    must be written (there is no sensible default source)."""

    tag_required: ClassVar[bool] = True
    #: the built-in source the block's fields (its settings Struct) build
    task_class: ClassVar[type[ConfiguredTask[Any]]]
    #: the task makes its topics itself at start (``SourceTask.topics``), with its own
    #: partition count: ``run --embedded-broker`` leaves them to it
    makes_topics: ClassVar[bool] = False

    def build(self) -> SourceTask:
        return self.task_class(**msgspec.structs.asdict(self))

    def topics(self) -> tuple[str, ...]:
        """The Kafka topics the task writes to, when the config says (embedded broker)."""
        topic = getattr(self, "topic", None)
        return (topic,) if isinstance(topic, str) else ()


class FilesTask(FileSourceSettings, TaskConfig, frozen=True, tag="files"):
    """``rc.FileSource``: the JSON lines of the files of a folder."""

    task_class = FileSource


class DeltaTask(DeltaTableSettings, TaskConfig, frozen=True, tag="delta"):
    """``rc.DeltaTableSource``: the rows each new version of a Delta table added."""

    task_class = DeltaTableSource


class GeneratorTask(GeneratorSettings, TaskConfig, frozen=True, tag="generator"):
    """``rc.GeneratorSource``: numbered demo records."""

    task_class = GeneratorSource


class PostgresTask(PostgresSettings, TaskConfig, frozen=True, tag="postgres"):
    """``rc.PostgresSource``: a PostgreSQL database's changes (needs
    ``transaction_boundary: connector``)."""

    task_class = PostgresSource
    makes_topics = True

    def topics(self) -> tuple[str, ...]:
        return tuple(self.topic(s, t) for s, t in self.qualified_tables)


class PythonTask(TaskConfig, frozen=True, tag="python"):
    """Any ``rc.SourceTask`` subclass: ``class: "package.module:ClassName"``, built with
    ``ClassName(**args)``. The class is imported when the file is read (a module in the
    current folder is found too), so a wrong path or arguments fail before anything starts."""

    class_: str = msgspec.field(name="class")
    args: dict[str, Any] = {}

    __repr__ = redacted_repr

    def __post_init__(self) -> None:
        cls = import_task_class(self.class_)
        try:
            signature = inspect.signature(cls)
        except (TypeError, ValueError):  # no signature to inspect: checked when built
            return
        params = signature.parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            named = [
                n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
            ]
            for key in self.args:
                if key not in named:
                    close = difflib.get_close_matches(str(key), named, n=1)
                    hint = f"did you mean {close[0]!r}? " if close else ""
                    raise ConfigError(
                        f"args: {self.class_} takes no argument {key!r}; {hint}"
                        f"it takes: {', '.join(named) or 'none'}"
                    )
        try:
            signature.bind(**self.args)
        except TypeError as e:
            raise ConfigError(f"args: do not fit {self.class_}: {e}") from None

    def build(self) -> SourceTask:
        cls = import_task_class(self.class_)
        if _pickle_by_value(cls.__module__):
            from ray import cloudpickle

            # a module of the user's folder, not installed: Ray workers may not find it
            cloudpickle.register_pickle_by_value(sys.modules[cls.__module__])
        try:
            return cls(**self.args)
        except Exception as e:
            raise ConfigError(f"{self.class_}(**args) failed: {type(e).__name__}: {e}") from None

    def topics(self) -> tuple[str, ...]:
        topic = self.args.get("topic")
        return (topic,) if isinstance(topic, str) else ()


def import_task_class(spec: str) -> type[SourceTask]:
    """``"package.module:ClassName"`` -> the class; ConfigError saying what is wrong."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"class must be written 'package.module:ClassName', got {spec!r}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        # console scripts do not put the current folder on sys.path: try it too
        cwd = os.getcwd()
        if e.name != module_name.split(".")[0] or cwd in sys.path:
            raise ConfigError(f"class {spec!r}: cannot import {module_name!r}: {e}") from None
        sys.path.append(cwd)
        try:
            module = importlib.import_module(module_name)
        except Exception as e2:
            sys.path.remove(cwd)
            raise ConfigError(
                f"class {spec!r}: cannot import {module_name!r}: {type(e2).__name__}: {e2}"
            ) from None
    except Exception as e:
        raise ConfigError(
            f"class {spec!r}: importing {module_name!r} failed: {type(e).__name__}: {e}"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"class {spec!r}: {module_name!r} has no {attr!r}") from None
    if not (isinstance(obj, type) and issubclass(obj, SourceTask)):
        what = obj.__name__ if isinstance(obj, type) else type(obj).__name__
        raise ConfigError(f"class {spec!r}: not a rayconnect.SourceTask subclass (it is {what!r})")
    return obj


def _pickle_by_value(module_name: str) -> bool:
    module = sys.modules.get(module_name)
    file = getattr(module, "__file__", None)
    if module_name.split(".")[0] == "rayconnect" or not file:
        return False
    return not any(part in ("site-packages", "dist-packages") for part in Path(file).parts)


class SourcePipelineConfig(SourceSettings, frozen=True, kw_only=True):
    """A ``kind: source`` pipeline file: ``rc.SourcePipeline``'s arguments, with ``task`` as
    a tagged ``{type: files | delta | generator | postgres | python, ...}`` mapping."""

    task: FilesTask | DeltaTask | GeneratorTask | PostgresTask | PythonTask

    def settings(self) -> SourceSettings:
        fields = msgspec.structs.asdict(self)
        del fields["task"]
        return SourceSettings(**fields)
