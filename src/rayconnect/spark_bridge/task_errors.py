"""The errors of a write's input, and how they cross from a Spark task to the driver.

Spark hands the driver a task's exception as a generic ``PythonException`` whose text holds
the task's traceback. A task marks the two errors the driver must re-raise as themselves
(an input-schema error, a bad record under ``errors: stop``) with a token in the message;
``from_task`` finds the token in the text and rebuilds the error.
"""

from __future__ import annotations

import pyarrow as pa

from rayconnect.formats.evolution import schema_differences
from rayconnect.formats.rows import BadRecordError

#: Marks a bad record (``errors: stop``) raised inside a Spark task.
_BAD_RECORD_MARK = "rayconnect-bad-record:"

#: Marks an input-schema error raised inside a Spark task, so the driver can re-raise it as
#: ``InputSchemaError`` instead of Spark's generic PythonException.
_INPUT_SCHEMA_MARK = "rayconnect-input-schema:"


class InputSchemaError(ValueError):
    """The Arrow data handed to the writer does not have the table's schema."""


def conform_block(table: pa.Table, schema: pa.Schema, index: int) -> pa.Table:
    """The block in exactly the table's column order and types, or ``InputSchemaError``."""
    problems = schema_differences(table.schema, schema)
    if problems:
        raise InputSchemaError(f"block {index}: {'; '.join(problems)}")
    return table.select(schema.names).cast(schema)


def bad_record_in_task(error: BadRecordError) -> ValueError:
    """A bad record raised in a Spark task, marked for ``from_task``."""
    return ValueError(f"{_BAD_RECORD_MARK} {error}")


def input_schema_in_task(detail: str) -> ValueError:
    """An input-schema error raised in a Spark task, marked for ``from_task``."""
    return ValueError(f"{_INPUT_SCHEMA_MARK} {detail}")


def from_task(error: Exception) -> Exception | None:
    """The marked error a Spark task raised, rebuilt from the text of the exception the
    driver got (its first line after the mark); None when no task marked one."""
    text = str(error)
    if _INPUT_SCHEMA_MARK in text:
        return InputSchemaError(_detail(text, _INPUT_SCHEMA_MARK))
    if _BAD_RECORD_MARK in text:
        return BadRecordError.from_text(_detail(text, _BAD_RECORD_MARK))
    return None


def _detail(text: str, mark: str) -> str:
    return text.split(mark, 1)[1].splitlines()[0].strip()
