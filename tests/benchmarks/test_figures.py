"""benchmarks/figures.py: plots are saved with a small palette (the 5 MB results budget)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from PIL import Image  # noqa: E402

from benchmarks.figures import PALETTE_COLOURS, save_figure  # noqa: E402


def test_a_plot_is_saved_as_a_palette_png(tmp_path: Path) -> None:
    fig, ax = plt.subplots()
    for i in range(12):  # more line colours than a plot usually has
        ax.plot(range(10), [x * i for x in range(10)], label=str(i))
    ax.legend()
    path = tmp_path / "plot.png"
    save_figure(fig, path, dpi=80)
    plt.close(fig)
    with Image.open(path) as image:
        assert image.format == "PNG" and image.mode == "P"
        assert len(image.getcolors(256) or ()) <= PALETTE_COLOURS
        assert image.size == (512, 384)  # 6.4 x 4.8 in at 80 dpi: the figure, not a crop
