"""The calibration's picture: α per length bin, a subplot per compressor, one colour per budget (its p5
solid with markers, its mean dotted), the threshold dashed."""

from __future__ import annotations

from pathlib import Path


def plot_alpha(rows: list[dict], threshold: float, path: str | Path, title: str = "") -> Path:
    """Write the PNG of ``rows`` (:mod:`.measure`'s) to ``path``; returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    compressors = list(dict.fromkeys(r["compressor"] for r in rows))
    fig, axes = plt.subplots(
        1, max(1, len(compressors)), figsize=(4.5 * max(1, len(compressors)), 3.8), squeeze=False, sharey=True
    )
    budgets = sorted({r["budget"] for r in rows})
    colours = plt.get_cmap("viridis")
    for ax, name in zip(axes[0], compressors):
        for k, budget in enumerate(budgets):
            mine = sorted(
                (r for r in rows if r["compressor"] == name and r["budget"] == budget), key=lambda r: r["bin_start"]
            )
            if not mine:
                continue
            x = [r["bin_start"] for r in mine]
            colour = colours(k / max(1, len(budgets) - 1))
            ax.plot(x, [r["alpha_p5"] for r in mine], "-o", color=colour, ms=3, label=f"{budget} p5")
            ax.plot(x, [r["alpha_mean"] for r in mine], ":", color=colour, label=f"{budget} mean")
        ax.axhline(threshold, color="black", ls="--", lw=1, label=f"threshold {threshold:g}")
        ax.set_title(name)
        ax.set_xlabel("sequence length (bin start)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("acceptance α")
    axes[0][-1].legend(fontsize=7, loc="lower left")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
