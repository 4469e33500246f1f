"""What a settings Struct's fields mean, read from the Struct itself.

A field is documented where it is declared, by ``#:`` comment lines right above it (the
convention Sphinx's autodoc reads too). ``describe`` returns each field's name, type, default
and those lines, so the settings reference (``docs/hooks.py``) and anyone at a prompt
(``describe(rc.CommitSettings)``) read one text, and a default is written only in the Struct.
No rayconnect import here: any package may use it without a cycle.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import types
import typing
from typing import Any

import msgspec


class FieldDoc(msgspec.Struct, frozen=True):
    """One field of a settings Struct, as the reference shows it."""

    name: str
    type: str
    #: the default as Python would write it; None: the field is required
    default: str | None
    doc: str


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its ``#:`` comment lines joined into one text ("" when it has none)."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    (node,) = ast.parse(source).body
    assert isinstance(node, ast.ClassDef)
    docs: dict[str, str] = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        comment: list[str] = []
        row = stmt.lineno - 2  # the line above, 0-based
        while row >= 0 and lines[row].strip().startswith("#:"):
            comment.insert(0, lines[row].strip()[2:].strip())
            row -= 1
        docs[stmt.target.id] = " ".join(comment)
    return docs


def describe(cls: type[msgspec.Struct]) -> list[FieldDoc]:
    """Every field of ``cls`` in declaration order, with its type, default and doc."""
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    out = []
    for field in msgspec.structs.fields(cls):
        if field.default is not msgspec.NODEFAULT:
            default: str | None = _python(field.default)
        elif field.default_factory is not msgspec.NODEFAULT:
            default = _python(field.default_factory())
        else:
            default = None
        out.append(FieldDoc(field.name, type_name(hints[field.name]), default, docs[field.name]))
    return out


def type_name(tp: Any) -> str:
    """A type as its annotation reads, without module paths or ``Annotated`` constraints."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        return type_name(args[0])
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if tp is type(None):
        return "None"
    return getattr(tp, "__name__", str(tp))


def _python(value: Any) -> str:
    if isinstance(value, msgspec.Struct):
        return f"{type(value).__name__}()"
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1e6:
        return f"{value:,.0f}".replace(",", "_")
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10_000:
        return f"{value:_}"
    return repr(value)
