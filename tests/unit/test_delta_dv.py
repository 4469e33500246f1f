"""Delta deletion vectors' bytes (``tables.delta_dv``) against the protocol's own examples
and a DV Databricks wrote: a DV we write is read by every engine only if these hold."""

from __future__ import annotations

import struct
import uuid
import zlib

import numpy as np
import pytest

from rayconnect.tables import delta_dv
from rayconnect.tables.delta_dv import DeletionVectorError, Descriptor

#: PROTOCOL.md "JSON Example 3 - Inline" (the older native layout) and its rows
PROTOCOL_INLINE = "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L"
PROTOCOL_ROWS = [3, 4, 7, 11, 18, 29]
#: a portable DV from a Databricks DELETE of row 1
DATABRICKS_DV = bytes.fromhex(
    "d1d339640100000000000000000000003a3000000100000000000000100000000100"
)


def test_z85_round_trip_and_rfc_vector() -> None:
    # ZeroMQ RFC 32's test vector
    data = bytes([0x86, 0x4F, 0xD2, 0x6F, 0xB5, 0x59, 0xF7, 0x5B])
    assert delta_dv.z85_encode(data) == "HelloWorld"
    assert delta_dv.z85_decode("HelloWorld") == data
    noise = np.random.default_rng(1).bytes(64)
    assert delta_dv.z85_decode(delta_dv.z85_encode(noise)) == noise


def test_z85_rejects_partial_words() -> None:
    with pytest.raises(DeletionVectorError):
        delta_dv.z85_encode(b"abc")
    with pytest.raises(DeletionVectorError):
        delta_dv.z85_decode("abcd")


def test_protocol_inline_example() -> None:
    descriptor = Descriptor("i", PROTOCOL_INLINE, size_in_bytes=40, cardinality=6)
    assert list(descriptor.read("", None)) == PROTOCOL_ROWS


def test_databricks_portable_dv() -> None:
    assert list(delta_dv.decode_bitmap(DATABRICKS_DV)) == [1]


def test_encode_is_magic_then_portable_64_bit_roaring() -> None:
    dv = delta_dv.encode_bitmap(np.array(PROTOCOL_ROWS, dtype=np.uint64))
    assert struct.unpack("<I", dv[:4])[0] == delta_dv.PORTABLE_MAGIC
    assert struct.unpack("<Q", dv[4:12])[0] == 1  # one 32-bit bucket
    assert struct.unpack("<I", dv[12:16])[0] == 0  # its high bits
    assert list(delta_dv.decode_bitmap(dv)) == PROTOCOL_ROWS
    assert delta_dv.encode_bitmap([1]) == DATABRICKS_DV


@pytest.mark.parametrize(
    "positions",
    [
        [],
        [0],
        list(range(0, 200_000, 3)),
        list(range(70_000)),  # runs
        [5, 1 << 32, (1 << 32) + 7, 3 << 33],  # several high buckets
    ],
)
def test_bitmap_round_trip(positions: list[int]) -> None:
    array = np.array(positions, dtype=np.uint64)
    back = delta_dv.positions_of(delta_dv.decode_bitmap(delta_dv.encode_bitmap(array)))
    assert back.dtype == np.uint64
    assert back.tolist() == positions


def test_bad_magic_is_refused() -> None:
    with pytest.raises(DeletionVectorError, match="magic"):
        delta_dv.decode_bitmap(b"\x00\x01\x02\x03" + DATABRICKS_DV[4:])


def test_file_layout_sizes_and_crcs() -> None:
    dvs = [delta_dv.encode_bitmap([1, 2]), delta_dv.encode_bitmap(range(1000))]
    data, offsets = delta_dv.encode_file(dvs)
    assert data[0] == 1
    assert offsets[0] == 1
    for dv, offset in zip(dvs, offsets, strict=True):
        assert struct.unpack_from(">I", data, offset)[0] == len(dv)
        assert data[offset + 4 : offset + 4 + len(dv)] == dv
        assert struct.unpack_from(">I", data, offset + 4 + len(dv))[0] == zlib.crc32(dv)
        assert delta_dv.read_from_file(data, offset, len(dv)) == dv
    assert offsets[1] == 1 + 4 + len(dvs[0]) + 4
    assert len(data) == offsets[1] + 4 + len(dvs[1]) + 4


def test_file_damage_is_detected() -> None:
    dv = delta_dv.encode_bitmap([1, 2])
    data, (offset,) = delta_dv.encode_file([dv])
    flipped = bytearray(data)
    flipped[offset + 10] ^= 0xFF
    with pytest.raises(DeletionVectorError, match="CRC"):
        delta_dv.read_from_file(bytes(flipped), offset, len(dv))
    with pytest.raises(DeletionVectorError, match="descriptor says"):
        delta_dv.read_from_file(data, offset, len(dv) - 1)
    with pytest.raises(DeletionVectorError, match="version"):
        delta_dv.read_from_file(b"\x02" + data[1:], offset, len(dv))


def test_protocol_relative_path_example() -> None:
    descriptor = Descriptor.from_json(
        {
            "storageType": "u",
            "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^",
            "offset": 4,
            "sizeInBytes": 40,
            "cardinality": 6,
        }
    )
    assert descriptor.absolute_path("s3://mytable/") == (
        "s3://mytable/ab/deletion_vector_d2c639aa-8816-431a-aaf6-d3fe2512ff61.bin"
    )
    assert descriptor.unique_id == "uab^-aqEH.-t@S}K{vb[*k^@4"
    absolute = Descriptor("p", "s3://t/deletion_vector_x.bin", 40, 6, 4)
    assert absolute.absolute_path("/elsewhere") == "s3://t/deletion_vector_x.bin"


def test_new_file_name_matches_its_descriptor() -> None:
    for prefix in ("", "_dv"):
        encoded, rel = delta_dv.new_file_name(prefix)
        assert len(encoded) == len(prefix) + delta_dv.UUID_Z85_LENGTH
        assert Descriptor("u", encoded, 1, 1, 1).absolute_path("/t") == f"/t/{rel}"
        file_id = uuid.UUID(rel.rsplit("deletion_vector_", 1)[1].removesuffix(".bin"))
        assert delta_dv.z85_decode(encoded[len(prefix) :]) == file_id.bytes


def test_descriptor_json_round_trip_and_read_from_file(tmp_path) -> None:
    from pyarrow import fs

    dv = delta_dv.encode_bitmap([0, 9])
    data, (offset,) = delta_dv.encode_file([dv])
    encoded, rel = delta_dv.new_file_name()
    (tmp_path / rel).write_bytes(data)
    descriptor = Descriptor("u", encoded, len(dv), 2, offset)
    assert Descriptor.from_json(descriptor.as_json()) == descriptor
    assert list(descriptor.read(str(tmp_path), fs.LocalFileSystem())) == [0, 9]
    wrong = Descriptor("u", encoded, len(dv), 3, offset)
    with pytest.raises(DeletionVectorError, match="descriptor says 3"):
        wrong.read(str(tmp_path), fs.LocalFileSystem())


def test_inline_descriptor_pads_to_whole_words() -> None:
    dv = delta_dv.encode_bitmap([1])  # 34 bytes: not whole Z85 words
    descriptor = Descriptor.inline(dv, 1)
    assert descriptor.size_in_bytes == 34
    assert "offset" not in descriptor.as_json()
    assert list(descriptor.read("", None)) == [1]
