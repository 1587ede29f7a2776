"""Plots (matplotlib, Agg backend): fronts, trees, acceptance-vs-entropy curves; each in the
format its file's suffix names (``PLOT_FORMATS``)."""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from entmtp.core import EntmtpError, atomic_write

from ._model_setup import check_outputs

PLOT_FORMATS = ("png", "pdf", "svg")


def plot_format(path: str | os.PathLike) -> str:
    """The format a plot at ``path`` is written in: its suffix, one of ``PLOT_FORMATS``."""
    suffix = Path(path).suffix.lower().removeprefix(".")
    if suffix not in PLOT_FORMATS:
        raise EntmtpError(f"plot {path}: name it .png, .pdf or .svg (the suffix is the format)")
    return suffix


def check_plots(*paths: Path | None) -> None:
    """Refuse, before any work, a plot path of no known format or one ``check_outputs``
    refuses; None: a plot option not given."""
    for path in paths:
        if path is not None:
            plot_format(path)
    check_outputs(*paths)


def _pyplot():
    try:
        import matplotlib
    except ImportError as err:  # pragma: no cover - matplotlib is a core dependency
        raise EntmtpError("plots need matplotlib: pip install matplotlib") from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: str | os.PathLike) -> Path:
    buffer = io.BytesIO()
    fig.savefig(buffer, format=plot_format(path), dpi=120, bbox_inches="tight")
    _pyplot().close(fig)
    return atomic_write(path, lambda handle: handle.write(buffer.getvalue()))


def plot_fronts(
    series: Sequence[Mapping],
    path: str | os.PathLike,
    *,
    title: str,
    references: Sequence[Mapping] = (),
    chosen: Sequence[Mapping] = (),
) -> Path:
    """Expected accept length vs verify latency.

    ``series``: [{"label", "points": [(latency_ms, accept_length), ...]}] one line per front;
    ``references``/``chosen``: [{"label", "latency_ms", "expected_accept_length"}] markers.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for item in series:
        points = sorted(item["points"])
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.2, label=item["label"])
    for ref in references:
        ax.scatter([ref["latency_ms"]], [ref["expected_accept_length"]], marker="*", s=160,
                   color="black", zorder=5, label=ref["label"])
    for pick in chosen:
        ax.scatter([pick["latency_ms"]], [pick["expected_accept_length"]], marker="s", s=70,
                   facecolors="none", edgecolors="red", linewidths=1.5, zorder=6,
                   label=pick["label"])
    ax.set_xlabel("verification latency per step (ms)")
    ax.set_ylabel("expected accepted tokens per step")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, path)


def plot_tree(paths: Sequence[Sequence[int]], path: str | os.PathLike, *, title: str) -> Path:
    """Draw a draft tree: depth downwards, each node labelled with its rank."""
    plt = _pyplot()
    nodes = [()] + [tuple(p) for p in paths]
    children: dict[tuple, list[tuple]] = {node: [] for node in nodes}
    for node in nodes[1:]:
        children[node[:-1]].append(node)
    x_of: dict[tuple, float] = {}
    next_leaf = [0.0]

    def place(node: tuple) -> float:
        kids = sorted(children[node])
        if not kids:
            x_of[node] = next_leaf[0]
            next_leaf[0] += 1.0
        else:
            xs = [place(kid) for kid in kids]
            x_of[node] = sum(xs) / len(xs)
        return x_of[node]

    place(())
    width = max(next_leaf[0], 1.0)
    depth = max((len(n) for n in nodes), default=0)
    fig, ax = plt.subplots(figsize=(min(2 + 0.35 * width, 30), 1.5 + 1.1 * depth))
    for node in nodes[1:]:
        parent = node[:-1]
        ax.plot([x_of[parent], x_of[node]], [-len(parent), -len(node)], color="0.6", lw=0.8)
    for node in nodes:
        label = "root" if not node else str(node[-1])
        size = 520 if not node else 160  # the root's marker holds its four letters
        ax.scatter([x_of[node]], [-len(node)], s=size, color="white", edgecolors="black",
                   zorder=3)
        ax.text(x_of[node], -len(node), label, ha="center", va="center", fontsize=7, zorder=4)
    ax.set_yticks([-d for d in range(depth + 1)], [f"depth {d}" for d in range(depth + 1)])
    ax.set_xticks([])
    xs = list(x_of.values())
    ax.set_xlim(min(xs) - 0.7, max(xs) + 0.7)  # no marker cut by the axes
    ax.set_ylim(-depth - 0.4, 0.4)
    ax.set_title(title)
    for side in ("top", "right", "bottom"):
        ax.spines[side].set_visible(False)
    return _save(fig, path)


def plot_acceptance_curves(
    bucket_entropy: Sequence[float],
    acceptance: Sequence[Sequence[float]],
    path: str | os.PathLike,
    *,
    title: str,
    label: str = "top-1",
) -> Path:
    """Per head, acceptance probability vs mean entropy of each entropy bucket.

    ``acceptance[head][bucket]``.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for head, values in enumerate(acceptance, start=1):
        ax.plot(bucket_entropy, values, marker="o", label=f"head {head} {label}")
    ax.set_xlabel("base-model entropy (nats, bucket mean)")
    ax.set_ylabel("P(true token accepted)")
    ax.set_ylim(0, 1)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)
