"""The demo's Ray folder fits Ray's unix sockets whatever $TMPDIR is (a CI's deep one made
``ray.init`` refuse: "AF_UNIX path length cannot exceed 107 bytes")."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from rayconnect.demo.stage import ray_scratch

# what Ray puts below its temp dir, at its longest (a 7-digit pid)
SOCKET = "/ray/session_2026-12-07_17-40-25_445160_2822999/sockets/plasma_store"


@pytest.mark.parametrize("depth", [0, 1, 4])
def test_the_scratch_folder_leaves_room_for_rays_sockets(
    depth: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = Path(tempfile.mkdtemp(prefix="rcb", dir="/tmp"))  # as a CI runner's /tmp/rcbNNNNN
    try:
        base = deep / "tmp" / "/".join(["tmp-folder-of-a-runner"] * depth)
        base.mkdir(parents=True, exist_ok=True)
        monkeypatch.setattr(tempfile, "tempdir", str(base))
        scratch = ray_scratch()
        try:
            assert scratch.is_dir()
            assert len(str(scratch) + SOCKET) <= 107, scratch
            if depth == 0:
                assert scratch.parent == base  # $TMPDIR kept where it fits
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    finally:
        shutil.rmtree(deep, ignore_errors=True)
