"""The docs test's reading of a page (``tests/markdown_blocks.py``): which blocks are shell
blocks, and that a marker either says skip/slow with a reason or fails - a typo must not
turn a block off unseen."""

from __future__ import annotations

from pathlib import Path

import pytest
from markdown_blocks import shell_blocks


def _page(tmp_path: Path, text: str) -> Path:
    (tmp_path / "page.md").write_text(text)
    return tmp_path


def test_shell_blocks_with_their_markers_and_nothing_else(tmp_path: Path) -> None:
    root = _page(
        tmp_path,
        "# t\n\n```bash\necho one\n```\n\n```python\nprint(2)\n```\n\n```\n$ output\n```\n\n"
        "<!-- docs-test: skip (needs a cluster) -->\n```bash\nray up\n```\n\n"
        "<!-- docs-test: slow (two minutes) -->\n```sh\nsleep 120\n```\n",
    )
    blocks = shell_blocks(root, "page.md")
    assert [(b.line, b.text, b.mode, b.reason) for b in blocks] == [
        (3, "echo one\n", "run", ""),
        (16, "ray up\n", "skip", "needs a cluster"),
        (21, "sleep 120\n", "slow", "two minutes"),
    ]
    assert blocks[1].where == "page.md:16"


@pytest.mark.parametrize(
    "marker",
    ["<!-- docs-test: skip -->", "<!-- docs-test: skpi (x) -->", "<!-- docs-test skip -->"],
)
def test_a_marker_without_a_reason_or_with_another_word_fails(tmp_path: Path, marker: str) -> None:
    root = _page(tmp_path, f"{marker}\n```bash\necho\n```\n")
    with pytest.raises(ValueError, match="no docs-test marker"):
        shell_blocks(root, "page.md")


def test_a_block_that_never_closes_fails(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="never closes"):
        shell_blocks(_page(tmp_path, "```bash\necho\n"), "page.md")
