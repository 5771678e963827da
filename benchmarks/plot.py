"""The main curves of a benchmark run as one PNG (needs matplotlib: the `bench` extra)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.rows import Row


def _plain_log_x(ax: Any) -> None:
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def _missing(ax: Any, title: str) -> None:
    ax.set_title(title)
    ax.text(0.5, 0.5, "not run", ha="center", va="center", transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])


def _pipeline(ax: Any, rows: Sequence[Row]) -> None:
    title = "1. Input pipeline vs fused op"
    rows = [r for r in rows if r.section == "pipeline"]
    if not rows:
        return _missing(ax, title)
    labels = {
        "stateless": "StatelessRngDataset",
        "stateful": "stateful-RNG map",
        "in_graph": "StatelessRngDataset, tf.function",
    }
    styles = {"stateless": "o-", "stateful": "s--", "in_graph": "^:"}
    for kind, label in labels.items():
        for cores in sorted({r.params["cores"] for r in rows}):
            points = sorted(
                (r.params["batch"], r.ratio)
                for r in rows
                if r.params["pipeline"] == kind and r.params["cores"] == cores
            )
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, styles[kind], label=f"{label}, {cores} core(s)")
    ax.axhline(0.9, color="grey", linewidth=0.8, linestyle="--", label="target 0.9")
    ax.set_xscale("log", base=2)
    ax.set_xticks(
        sorted({r.params["batch"] for r in rows}),
        [str(b) for b in sorted({r.params["batch"] for r in rows})],
    )
    ax.set_ylim(bottom=0)
    ax.set_xlabel("batch size")
    ax.set_ylabel("throughput / fused op")
    ax.set_title(title)
    ax.legend(fontsize=7)


def _fingerprint(ax: Any, rows: Sequence[Row]) -> None:
    title = "3a. Fingerprint vs raw hashing"
    points = sorted(
        (r.params["weights_bytes"] / 1e6, r.ratio)
        for r in rows
        if r.section == "fingerprint" and r.params.get("read") == "read_value"
    )
    if not points:
        return _missing(ax, title)
    xs, ys = zip(*points, strict=True)
    ax.plot(xs, ys, "o-", label="fingerprint_state")
    ax.axhline(0.8, color="grey", linewidth=0.8, linestyle="--", label="target 0.8")
    _plain_log_x(ax)
    ax.set_xlabel("model weights (MB; state hashed is 3x with Adam)")
    ax.set_ylabel("throughput / raw blake3")
    ax.set_ylim(bottom=0)
    ax.set_title(title)
    ax.legend(fontsize=7)


def _scaling(ax: Any, rows: Sequence[Row]) -> None:
    title = "6. Latency growth with stored runs"
    rows = [r for r in rows if r.section == "scaling"]
    if not rows:
        return _missing(ax, title)
    for database, style in (("postgresql", "-"), ("sqlite", "--")):
        for kind in dict.fromkeys(r.params["kind"] for r in rows):
            mine = [
                r for r in rows if r.params["database"] == database and r.params["kind"] == kind
            ]
            if mine:
                points = [(mine[0].params["base"], 1.0)] + [
                    (r.params["runs"], r.ratio) for r in mine
                ]
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, "o" + style, label=f"{kind}, {database}")
    _plain_log_x(ax)
    ax.set_xlabel("runs stored")
    ax.set_ylabel("median latency / at the smallest size")
    ax.set_title(title)
    ax.legend(fontsize=6, ncol=2)


def _training(ax: Any, rows: Sequence[Row]) -> None:
    title = "2. Op determinism on/off and 3b. trace share"
    determinism = [r for r in rows if r.section == "determinism"]
    trace = {r.params["model"]: r.ratio for r in rows if r.section == "trace"}
    if not determinism:
        return _missing(ax, title)
    models = [r.params["model"] for r in determinism]
    bars = ax.bar(models, [r.ratio for r in determinism], color="tab:blue")
    for bar, model in zip(bars, models, strict=True):
        share = trace.get(model)
        if share is not None:
            ax.annotate(
                f"trace {share * 100:.1f}%",
                (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                ha="center",
                va="bottom",
                fontsize=7,
            )
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_ylabel("steps/s with / without op determinism")
    ax.set_title(title)


def write_plot(rows: Sequence[Row], path: Path, subtitle: str) -> None:
    """Four panels: pipeline, fingerprinting, training costs, scaling."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 9))
    _pipeline(axes[0][0], rows)
    _fingerprint(axes[0][1], rows)
    _training(axes[1][0], rows)
    _scaling(axes[1][1], rows)
    fig.suptitle(f"Reprotrain benchmarks: {subtitle}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
