"""The actors' statuses are typed all the way down: no field of a reader's, a participant
host's or the enumerator's status (nor of anything they hold) is ``Any``, so every reader
of them (the handle, the coordinator, ``rayconnect status``) is checked by mypy."""

from __future__ import annotations

import msgspec
import pytest

from rayconnect.protocol.actor_status import DiscoveryStatus, HostStatus, ReaderStatus


def _any_fields(t: msgspec.inspect.Type, path: str, seen: set[type]) -> list[str]:
    if isinstance(t, msgspec.inspect.AnyType):
        return [path]
    if isinstance(t, msgspec.inspect.StructType):
        if t.cls in seen:
            return []
        seen.add(t.cls)
        return [found for f in t.fields for found in _any_fields(f.type, f"{path}.{f.name}", seen)]
    inner: list[msgspec.inspect.Type] = []
    if isinstance(t, msgspec.inspect.UnionType):
        inner = list(t.types)
    elif isinstance(t, msgspec.inspect.DictType):
        inner = [t.key_type, t.value_type]
    elif isinstance(
        t, (msgspec.inspect.ListType, msgspec.inspect.SetType, msgspec.inspect.VarTupleType)
    ):
        inner = [t.item_type]
    elif isinstance(t, msgspec.inspect.TupleType):
        inner = list(t.item_types)
    return [found for i in inner for found in _any_fields(i, path, seen)]


@pytest.mark.parametrize("status", [ReaderStatus, HostStatus, DiscoveryStatus])
def test_an_actor_status_has_no_any_field(status: type) -> None:
    assert _any_fields(msgspec.inspect.type_info(status), status.__name__, set()) == []


def test_a_reader_that_did_not_answer_is_a_status_with_only_its_error() -> None:
    status = ReaderStatus(error="RayActorError: restarting")
    assert status.partitions == {} and status.metadata_updates == 0
