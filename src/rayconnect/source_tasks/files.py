"""FileSource: every line of the JSON-lines files of a folder, new files picked up.

Source partition ``{"file": <name>}``, offset ``{"line": n}`` (0-based line of the last record
sent). Lines are sent as they are (the value is the line's bytes without the newline), keyed
by file name so a file's lines keep their order in Kafka. A line is read only once it ends in
a newline, so a file being appended to is safe; files must only ever be appended to.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
from pathlib import Path

import msgspec

from rayconnect.errors import require
from rayconnect.settings_types import NonNegativeFloat, PositiveInt
from rayconnect.source_tasks.base import (
    ConfiguredTask,
    SourceRecord,
    SourceTaskContext,
    check_topic,
)


class FileSourceSettings(msgspec.Struct, frozen=True):
    """FileSource's parameters: its constructor's and a pipeline file's ``task:`` block's."""

    #: the folder read; new files are picked up
    path: str
    #: the topic written to
    topic: str
    #: which files of the folder are read (JSON lines; offset = file + line)
    pattern: str = "*.jsonl"
    #: most records one poll returns
    batch_size: PositiveInt = 1000
    #: how long a poll waits when there is nothing new
    idle_s: NonNegativeFloat = 0.2

    def __post_init__(self) -> None:
        require(bool(self.path), "path: must not be empty")
        check_topic("topic", self.topic)


class FileSource(ConfiguredTask[FileSourceSettings]):
    settings_type = FileSourceSettings

    async def start(self, context: SourceTaskContext) -> None:
        self.context = context
        self._files: dict[str, _FileCursor] = {}

    async def poll(self) -> list[SourceRecord]:
        records = await asyncio.to_thread(self._read)
        if not records:
            await asyncio.sleep(self.settings.idle_s)
        return records

    def _read(self) -> list[SourceRecord]:
        for name in sorted(os.listdir(self.settings.path)):
            if name not in self._files and fnmatch.fnmatch(name, self.settings.pattern):
                partition = {"file": name}
                if self.context.owns(partition):
                    committed = self.context.offset(partition)
                    skip = 0 if committed is None else committed["line"] + 1
                    self._files[name] = _FileCursor(Path(self.settings.path) / name, skip)
        records: list[SourceRecord] = []
        for name, cursor in sorted(self._files.items()):
            for line_no, line in cursor.read(self.settings.batch_size - len(records)):
                records.append(
                    SourceRecord(
                        self.settings.topic,
                        line,
                        key=name.encode(),
                        source_partition={"file": name},
                        source_offset={"line": line_no},
                    )
                )
            if len(records) >= self.settings.batch_size:
                break
        return records


class _FileCursor:
    """Reads complete lines of one file from where the last read stopped."""

    def __init__(self, path: Path, skip_lines: int) -> None:
        self.path = path
        self.pos = 0  # byte offset of the next unread line
        self.line = 0  # its line number
        self.skip = skip_lines

    def read(self, limit: int) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        if limit <= 0:
            return out
        with open(self.path, "rb") as f:
            f.seek(self.pos)
            while len(out) < limit:
                raw = f.readline()
                if not raw.endswith(b"\n"):
                    break  # end of file, or a line still being written
                self.pos += len(raw)
                n = self.line
                self.line += 1
                if n < self.skip:
                    continue
                line = raw.rstrip(b"\r\n")
                if line:
                    out.append((n, line))
        return out
