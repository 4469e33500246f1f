"""Delta deletion vectors (PROTOCOL.md "Deletion Vectors", "Deletion Vector Format"): the
bytes, the files that hold them and the descriptors the log keeps - format code only.

Why by hand: delta-rs 1.6.6 reads deletion vectors but writes none (its DELETE/MERGE are
copy-on-write), so a merge-on-read round builds them itself.

- A DV is a ``RoaringBitmapArray``: the magic 1681511377 as a little-endian int32, then the
  64-bit roaring "portable" serialization (bucket count as uint64, then per bucket its high
  32 bits as uint32 and a 32-bit portable roaring bitmap) - exactly what pyroaring's
  ``BitMap64.serialize()`` writes. The older "native" layout (big-endian magic 1681511376,
  the protocol's inline example) is read too, never written.
- A DV file: a version byte 1, then per DV a big-endian size, the DV, a big-endian CRC-32 of
  the DV. A descriptor's ``offset`` points at the size, so the first DV is at 1.
- Descriptor ``storageType``: ``u`` (``pathOrInlineDv`` = optional random prefix + the file's
  UUID in Z85, 20 characters; the file is ``<table>/<prefix>/deletion_vector_<uuid>.bin``),
  ``p`` (an absolute path) or ``i`` (the DV itself, Z85).

Positions are 0-based row indexes in the data file, as uint64 numpy arrays.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

import numpy as np
from pyroaring import BitMap64

#: RoaringBitmapArray magics: portable (written) and native (read only)
PORTABLE_MAGIC = 1681511377
NATIVE_MAGIC = 1681511376
#: the DV file layout's version byte
FILE_FORMAT_VERSION = 1
#: the Z85 length of a UUID (16 bytes); a 'u' descriptor's characters before it are a prefix
UUID_Z85_LENGTH = 20
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {c: i for i, c in enumerate(_Z85)}
#: Java reads the high 32 bits signed: the protocol wants them below 2**31
_MAX_POSITION = (1 << 63) - 1


class DeletionVectorError(ValueError):
    """A DV's bytes or its descriptor do not follow the protocol (bad magic, CRC, size)."""


# -- Z85 (ZeroMQ RFC 32), the JSON-safe base85 of descriptors -----------------------------


def z85_encode(data: bytes) -> str:
    """Z85 has no padding: the protocol pads inline DVs' bytes to 4 itself, never here."""
    if len(data) % 4:
        raise DeletionVectorError(f"Z85 encodes whole 4-byte words, not {len(data)} bytes")
    chars: list[str] = []
    for (word,) in struct.iter_unpack(">I", data):
        digits = []
        for _ in range(5):
            word, digit = divmod(word, 85)
            digits.append(_Z85[digit])
        chars.extend(reversed(digits))
    return "".join(chars)


def z85_decode(text: str) -> bytes:
    if len(text) % 5:
        raise DeletionVectorError(f"Z85 text of {len(text)} characters is not whole words")
    out = bytearray()
    for i in range(0, len(text), 5):
        word = 0
        for char in text[i : i + 5]:
            try:
                word = word * 85 + _Z85_INDEX[char]
            except KeyError:
                raise DeletionVectorError(f"{char!r} is not a Z85 character") from None
        if word >= 1 << 32:
            raise DeletionVectorError(f"Z85 group {text[i : i + 5]!r} overflows 32 bits")
        out += struct.pack(">I", word)
    return bytes(out)


# -- RoaringBitmapArray -------------------------------------------------------------------


def encode_bitmap(positions: np.ndarray | Sequence[int] | BitMap64) -> bytes:
    """The serialized DV of ``positions`` (run-optimized: deletes come in runs, e.g. a
    truncated partition)."""
    bitmap = positions if isinstance(positions, BitMap64) else to_bitmap(positions)
    if len(bitmap) and bitmap.max() > _MAX_POSITION:
        raise DeletionVectorError(f"row position {bitmap.max()} is beyond 2**63")
    bitmap = bitmap.copy()
    bitmap.run_optimize()
    return struct.pack("<I", PORTABLE_MAGIC) + bitmap.serialize()


def to_bitmap(positions: np.ndarray | Sequence[int]) -> BitMap64:
    return BitMap64(np.asarray(positions, dtype=np.uint64).tolist())


def decode_bitmap(data: bytes) -> BitMap64:
    if len(data) < 4:
        raise DeletionVectorError(f"a DV of {len(data)} bytes has no magic number")
    if struct.unpack("<I", data[:4])[0] == PORTABLE_MAGIC:
        try:
            return BitMap64.deserialize(data[4:])
        except (ValueError, OSError) as exc:
            raise DeletionVectorError(f"unreadable portable roaring bitmap: {exc}") from exc
    if struct.unpack(">I", data[:4])[0] == NATIVE_MAGIC:
        return _decode_native(data[4:])
    raise DeletionVectorError(f"unknown DV magic number {data[:4].hex()}")


def _decode_native(data: bytes) -> BitMap64:
    """Native layout: big-endian bitmap count, then per bitmap its size and a 32-bit
    portable roaring bitmap; the high 32 bits are the bitmap's index."""
    from pyroaring import BitMap

    (count,) = struct.unpack_from(">i", data, 0)
    at = 4
    out = BitMap64()
    for high in range(count):
        (size,) = struct.unpack_from(">i", data, at)
        low = BitMap.deserialize(data[at + 4 : at + 4 + size])
        out.update(np.asarray(low.to_array(), dtype=np.uint64) + np.uint64(high << 32))
        at += 4 + size
    return out


def positions_of(bitmap: BitMap64) -> np.ndarray:
    return np.asarray(bitmap.to_array(), dtype=np.uint64)


# -- DV files -----------------------------------------------------------------------------


def encode_file(dvs: Sequence[bytes]) -> tuple[bytes, list[int]]:
    """A DV file holding ``dvs`` (serialized DVs) and each one's descriptor ``offset``."""
    out = bytearray([FILE_FORMAT_VERSION])
    offsets = []
    for dv in dvs:
        offsets.append(len(out))
        out += struct.pack(">I", len(dv)) + dv + struct.pack(">I", zlib.crc32(dv))
    return bytes(out), offsets


def read_from_file(data: bytes, offset: int, size: int) -> bytes:
    """One DV of a DV file's bytes, its size and CRC checked (a torn or foreign file must
    not silently un-delete or delete rows)."""
    if not data or data[0] != FILE_FORMAT_VERSION:
        raise DeletionVectorError(f"DV file format version {data[:1].hex()} is not 1")
    if offset + 8 + size > len(data):
        raise DeletionVectorError(f"DV at {offset} (+{size}) is past the file's end")
    (stored_size,) = struct.unpack_from(">I", data, offset)
    if stored_size != size:
        raise DeletionVectorError(f"DV at {offset}: {stored_size} bytes, descriptor says {size}")
    dv = data[offset + 4 : offset + 4 + size]
    (crc,) = struct.unpack_from(">I", data, offset + 4 + size)
    if zlib.crc32(dv) != crc:
        raise DeletionVectorError(f"DV at {offset}: CRC-32 mismatch")
    return dv


def new_file_name(prefix: str = "") -> tuple[str, str]:
    """(``pathOrInlineDv``, path relative to the table) of a new DV file."""
    file_id = uuid.uuid4()
    return prefix + z85_encode(file_id.bytes), _relative_path(prefix, file_id)


def _relative_path(prefix: str, file_id: uuid.UUID) -> str:
    name = f"deletion_vector_{file_id}.bin"
    return f"{prefix}/{name}" if prefix else name


# -- descriptors --------------------------------------------------------------------------


@dataclass(frozen=True)
class Descriptor:
    """A ``deletionVector`` of an add or remove action (the log's camelCase in ``as_json``)."""

    storage_type: str
    path_or_inline_dv: str
    size_in_bytes: int
    cardinality: int
    offset: int | None = None

    @classmethod
    def from_json(cls, action: Mapping[str, Any]) -> Descriptor:
        offset = action.get("offset")
        return cls(
            storage_type=action["storageType"],
            path_or_inline_dv=action["pathOrInlineDv"],
            size_in_bytes=int(action["sizeInBytes"]),
            cardinality=int(action["cardinality"]),
            offset=None if offset is None else int(offset),
        )

    @classmethod
    def inline(cls, dv: bytes, cardinality: int) -> Descriptor:
        """An inline DV; its bytes are zero-padded to whole Z85 words (the size says where
        they end)."""
        padded = dv + bytes(-len(dv) % 4)
        return cls("i", z85_encode(padded), len(dv), cardinality)

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "storageType": self.storage_type,
            "pathOrInlineDv": self.path_or_inline_dv,
        }
        if self.offset is not None:
            out["offset"] = self.offset
        out["sizeInBytes"] = self.size_in_bytes
        out["cardinality"] = self.cardinality
        return out

    @property
    def unique_id(self) -> str:
        """A logical file's key beside its path (Delta's replay rule)."""
        base = f"{self.storage_type}{self.path_or_inline_dv}"
        return base if self.offset is None else f"{base}@{self.offset}"

    def absolute_path(self, table_root: str) -> str:
        """The DV file of a 'u' or 'p' descriptor (``table_root`` without a trailing '/')."""
        if self.storage_type == "p":
            return self.path_or_inline_dv
        if self.storage_type != "u":
            raise DeletionVectorError(f"a {self.storage_type!r} DV has no file")
        encoded = self.path_or_inline_dv
        prefix, tail = encoded[:-UUID_Z85_LENGTH], encoded[-UUID_Z85_LENGTH:]
        file_id = uuid.UUID(bytes=z85_decode(tail))
        return f"{table_root.rstrip('/')}/{_relative_path(prefix, file_id)}"

    def read(self, table_root: str, filesystem: Any) -> BitMap64:
        """The rows this descriptor deletes (``filesystem``: pyarrow's, opening paths under
        ``table_root``; a 'p' path is taken as a URI and opened by its path part)."""
        if self.storage_type == "i":
            dv = z85_decode(self.path_or_inline_dv)[: self.size_in_bytes]
        else:
            with filesystem.open_input_file(_fs_path(self.absolute_path(table_root))) as fh:
                data = fh.read()
            dv = read_from_file(data, self.offset or 0, self.size_in_bytes)
        bitmap = decode_bitmap(dv)
        if len(bitmap) != self.cardinality:
            raise DeletionVectorError(
                f"DV {self.unique_id}: {len(bitmap)} rows, descriptor says {self.cardinality}"
            )
        return bitmap


def _fs_path(path: str) -> str:
    """A pyarrow filesystem path of a URI (``file:///t/x`` -> ``/t/x``, ``s3://b/x`` ->
    ``b/x``); plain paths as they are."""
    if path.startswith("file://"):
        return unquote(path[len("file://") :])
    if "://" in path:
        return unquote(path.split("://", 1)[1])
    return path


def dv_unique_id(action: Mapping[str, Any]) -> str | None:
    """The unique id of an add's or remove's deletion vector (None: it has none): with the
    path, what names a logical file."""
    dv = action.get("deletionVector")
    return None if not dv else Descriptor.from_json(dv).unique_id
