"""Keep credentials out of everything a person or a dashboard can see.

Kafka client properties carry secrets (``sasl.plain.password``, ``sasl.jaas.config``,
``ssl.key.password``...), and so do a table's storage options (``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``azure_storage_account_key``, ``google_service_account_key``...). They must reach aiokafka unchanged, and must never show in status
output, logs, metric tags, the Ray dashboard or the ``repr`` of a configuration. Every place
that shows a configuration or a status passes it through ``redact`` first.

Pure Python + msgspec (no IO library), so ``rayconnect.protocol`` may use it too.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

__all__ = ["MASK", "is_secret_key", "redact", "redact_properties", "redacted_repr"]

MASK = "***"

# Java-style dotted names and aiokafka's underscored names alike.
# Object-store options too (delta-rs ``storage_options``): AWS access key id and secret,
# session tokens, Azure account/SAS keys, GCS service-account JSON.
_SECRET_KEY = re.compile(
    r"password|passwd|secret|token|credential|api[._-]?key|private[._-]?key"
    r"|sasl[._]jaas[._]config|ssl[._]key(?![._]?store[._]type)"
    r"|access[._-]?key|account[._-]?key|master[._-]?key|(?:^|[._-])sas(?:[._-]|$)"
    r"|service[._-]?account",
    re.IGNORECASE,
)


def is_secret_key(key: str) -> bool:
    """True if a property or field named ``key`` holds a credential."""
    return bool(_SECRET_KEY.search(key))


def redact_properties(properties: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``properties`` with every credential's value replaced by ``***``."""
    return {k: (MASK if is_secret_key(str(k)) else v) for k, v in properties.items()}


def redact(value: Any) -> Any:
    """A copy of ``value`` (Structs, dicts, lists, scalars) safe to print or log.

    Structs become plain builtins; any mapping entry whose key names a credential is masked,
    at any depth.
    """
    if isinstance(value, msgspec.Struct):
        value = msgspec.to_builtins(value)
    if isinstance(value, dict):
        return {
            k: (
                MASK
                if isinstance(k, str) and is_secret_key(k) and v not in (None, "")
                else redact(v)
            )
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return type(value)(redact(v) for v in value)
    return value


def _struct_repr(value: Any) -> str:
    if isinstance(value, msgspec.Struct):
        fields = ", ".join(
            f"{name}={_struct_repr(getattr(value, name))}" for name in value.__struct_fields__
        )
        return f"{type(value).__name__}({fields})"
    if isinstance(value, dict):
        items = ", ".join(
            f"{k!r}: {MASK!r}"
            if isinstance(k, str) and is_secret_key(k)
            else f"{k!r}: {_struct_repr(v)}"
            for k, v in value.items()
        )
        return "{" + items + "}"
    if isinstance(value, tuple):
        inner = ", ".join(_struct_repr(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(_struct_repr(v) for v in value) + "]"
    return repr(value)


def redacted_repr(self: msgspec.Struct) -> str:
    """A Struct ``__repr__`` that masks credentials: ``__repr__ = redacted_repr``."""
    return _struct_repr(self)
