"""Saving the benchmarks' plots small: benchmarks/results/ keeps to a 5 MB budget.

A matplotlib PNG of lines and bars uses a few dozen colours; saved in full colour it is
three to four times the size of the same picture with a 64-colour palette, which reads the
same (checked by eye on every plot in benchmarks/results when the budget was set)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

__all__ = ["save_figure"]

PALETTE_COLOURS = 64


def save_figure(fig: Any, path: Path, dpi: int = 110, **savefig: Any) -> None:
    """``fig.savefig`` to ``path`` as a PNG with a ``PALETTE_COLOURS`` palette."""
    from PIL import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, **savefig)
    buffer.seek(0)
    with Image.open(buffer) as image:
        image.convert("RGB").quantize(PALETTE_COLOURS).save(path, format="PNG", optimize=True)
