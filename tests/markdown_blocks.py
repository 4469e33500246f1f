"""The shell blocks of a markdown page, as the docs test runs them.

A page's ```` ```bash ```` blocks are what a reader types, so they are read out of the page
itself: editing the page changes what the test runs. An HTML comment on the line before a
block (invisible on the site) says how the test treats it:

- none: the block runs;
- ``<!-- docs-test: slow (reason) -->``: it runs in the ``slow`` group only (``pytest -m
  slow``), for a block too slow for CI that rarely breaks;
- ``<!-- docs-test: skip (reason) -->``: it cannot run here (a real cluster, a real
  Kafka...); the test reports it as skipped with the reason - never silently.

A marker without a reason, or with another word, is an error, so a typo cannot turn a block
off.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!--\s*docs-test:\s*(\w+)\s*(?:\((.+)\))?\s*-->\s*$")
MODES = ("run", "slow", "skip")


@dataclass(frozen=True)
class ShellBlock:
    """One ```` ```bash ```` block: where it is, its text, and what its marker says."""

    page: str  # the page's path, relative to the repository
    line: int  # the line of its opening fence, 1-based
    text: str
    mode: str  # one of MODES
    reason: str = ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def shell_blocks(root: Path, page: str) -> list[ShellBlock]:
    """Every ```` ```bash ```` block of ``root/page``, in order, with its marker read."""
    lines = (root / page).read_text().splitlines()
    blocks: list[ShellBlock] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
        if end is None:
            raise ValueError(f"{page}:{i + 1}: a code block that never closes")
        if fence[1] in ("bash", "sh", "shell", "console"):
            mode, reason = _marker(page, lines, i)
            blocks.append(
                ShellBlock(page, i + 1, "\n".join(lines[i + 1 : end]) + "\n", mode, reason)
            )
        i = end + 1
    return blocks


def _marker(page: str, lines: list[str], fence: int) -> tuple[str, str]:
    """The marker on the line before the block's fence, if any: (mode, reason)."""
    before = lines[fence - 1].strip() if fence > 0 else ""
    if "docs-test" not in before:
        return "run", ""
    marker = _MARKER.match(before)
    if marker is None or marker[1] not in MODES or (marker[1] != "run" and not marker[2]):
        raise ValueError(
            f"{page}:{fence}: {before!r} is no docs-test marker: "
            "<!-- docs-test: skip (reason) --> or <!-- docs-test: slow (reason) -->"
        )
    return marker[1], (marker[2] or "").strip()
