"""Labels that fit their column: a table whose policy labels (`gated:drafter=suffix:drafter.min_token_prob=0.2`)
run past a column's width says the settings every label shares once, above or below the table, and shows a label
still too long as `[n] NAME`, given whole in a legend. Labels that fit are shown as they are."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence

LEGEND_WIDTH = 110


def split_label(label: str) -> list[str]:
    """`dsd:schedule=[[1,4,4]]:k=4` -> its `:`-separated parts; a colon inside brackets or braces stays."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for char in label:
        depth += (char in "[{") - (char in "]}")
        if char == ":" and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def fit_labels(labels: Sequence[str], width: int) -> tuple[list[str], list[str]]:
    """Each label as shown in a column `width` wide, and the notes that say what was left out (none when every
    label fits)."""
    if all(len(label) <= width for label in labels):
        return list(labels), []
    parts = [split_label(label) for label in labels]
    shared = [p for p in parts[0][1:] if all(p in mine[1:] for mine in parts)]
    notes = [f"every column: {':'.join(shared)}"] if shared else []
    shown = []
    for mine in parts:
        short = ":".join([mine[0], *(p for p in mine[1:] if p not in shared)])
        if len(short) > width:
            mark = f"[{sum(n.startswith('[') for n in notes) + 1}]"
            notes += textwrap.wrap(f"{mark} {short}", LEGEND_WIDTH, subsequent_indent="    ", break_on_hyphens=False)
            short = f"{mark} {mine[0]}"[:width]
        shown.append(short)
    return shown, notes
