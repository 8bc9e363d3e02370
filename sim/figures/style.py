"""What every figure shares: the palette, PNG files written atomically with pinned metadata, file-name parts.

Figures are built on matplotlib.figure.Figure, never pyplot: saving renders with
Agg whatever the backend, so the command line needs no display and notebooks
keep their inline backend (display(fig) shows them there).
"""

from __future__ import annotations

import io
import re
from pathlib import Path

from matplotlib.figure import Figure

from sim.core.errors import PlotError
from sim.core.io import write_atomic

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")
ACCEPTED, REJECTED, OWN, PAUSED, CONFIRM = "#2ca02c", "#e74c3c", "#9aa5b1", "#f5cba7", "#8e44ad"
# Pinned PNG metadata: the default carries matplotlib's version, which would change bytes across installs.
PNG_METADATA = {"Software": None}
DPI = 110  # default resolution of every PNG
MIN_DPI, MAX_DPI = 20, 600  # beyond 600 dpi the tallest figure would need gigabytes of memory to render
MAX_SIDE = 1 << 16  # Agg renders less than this many pixels per side
MAX_PIXELS = 200_000_000  # 800 MB of RGBA


def file_part(name: str) -> str:
    """A name as it may appear in a file name: anything but letters, digits, '.', '-' and '_' becomes '_'."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name)


def save(fig: Figure, path: Path, dpi: int = DPI) -> Path:
    """Render to memory, then write atomically: a killed run never leaves a truncated PNG behind."""
    width, height = (float(x) * dpi for x in fig.get_size_inches())
    if max(width, height) >= MAX_SIDE or width * height > MAX_PIXELS:
        raise PlotError(f"{path}: a {width:.0f} x {height:.0f} pixel figure is too large to render; lower --dpi")
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata=PNG_METADATA)
    write_atomic(path, buffer.getvalue())
    return path
