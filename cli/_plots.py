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


# Chosen trees: one marker and colour each (none of the buckets' viridis colours), drawn
# hollow and each smaller than the one before, so that trees at one point stay visible.
_CHOSEN_MARKERS = ("o", "s", "D", "^", "v", "P", "h", "p")
_CHOSEN_COLORS = ("tab:red", "tab:orange", "tab:pink", "tab:brown", "tab:cyan", "tab:olive",
                  "tab:purple", "tab:gray")


def tokens_per_second_levels(rates: Sequence[float], count: int = 5) -> list[float]:
    """Round tokens/s values spanning ``rates``, for iso-lines drawn as guides."""
    from matplotlib.ticker import MaxNLocator

    rates = [r for r in rates if r > 0]
    if not rates:
        return []
    low, high = min(rates), max(rates)
    if high <= low:
        low, high = 0.8 * low, 1.2 * high
    levels = MaxNLocator(nbins=count, steps=[1, 2, 2.5, 5, 10]).tick_values(low, high)
    return [float(v) for v in levels if v > 0]


def _iso_lines(ax, levels: Sequence[float]) -> None:
    """Dashed lines of equal tokens/s (accepted tokens per step / step seconds), each labelled
    where it leaves the axes; the limits stay those of the data."""
    xlim, ylim = ax.get_xlim(), ax.get_ylim()
    for level in levels:
        slope = level / 1000.0  # tokens per ms
        ax.plot(xlim, [slope * x for x in xlim], linestyle="--", linewidth=0.8, color="0.75",
                zorder=0)
        # where the line leaves the box: the top edge, or else the right edge
        x_top = ylim[1] / slope
        x, y = (x_top, ylim[1]) if xlim[0] <= x_top <= xlim[1] else (xlim[1], slope * xlim[1])
        if ylim[0] <= y <= ylim[1] and xlim[0] <= x <= xlim[1]:
            ax.annotate(f"{level:g} tokens/s", (x, y), xytext=(-2, -2),
                        textcoords="offset points", ha="right", va="top", fontsize=7,
                        color="0.45")
    ax.set_xlim(xlim)
    ax.set_ylim(ylim)


def _tag_chosen(ax, chosen: Sequence[Mapping]) -> None:
    """Number each chosen tree beside its marker; trees drawn at one spot share one label
    ("1, 2"), so that no number lands on another's marker."""
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    groups: list[list[int]] = []
    for i, pick in enumerate(chosen):
        for group in groups:
            first = chosen[group[0]]
            if (abs(pick["latency_ms"] - first["latency_ms"]) < 0.02 * (x1 - x0) and
                    abs(pick["expected_accept_length"] - first["expected_accept_length"])
                    < 0.04 * (y1 - y0)):
                group.append(i)
                break
        else:
            groups.append([i])
    for group in groups:
        first = chosen[group[0]]
        right = first["latency_ms"] > x0 + 0.8 * (x1 - x0)  # tag on the side with room
        ax.annotate(", ".join(str(chosen[i].get("tag", i)) for i in group),
                    (first["latency_ms"], first["expected_accept_length"]),
                    xytext=(-10 if right else 10, -13), textcoords="offset points",
                    ha="right" if right else "left", fontsize=8, fontweight="bold",
                    color=_CHOSEN_COLORS[group[0] % len(_CHOSEN_COLORS)], zorder=20,
                    bbox={"boxstyle": "round,pad=0.15", "facecolor": "white",
                          "edgecolor": "none", "alpha": 0.85})


def plot_fronts(
    series: Sequence[Mapping],
    path: str | os.PathLike,
    *,
    title: str,
    references: Sequence[Mapping] = (),
    chosen: Sequence[Mapping] = (),
    plain: Mapping | None = None,
    note: str | None = None,
) -> Path:
    """Expected accept length vs step latency, with equal-tokens/s lines as guides.

    ``series``: [{"label", "points": [(latency_ms, accept_length), ...]}] one line per front,
    the first drawn bold (all positions), the others (entropy buckets, in order) in a sequence
    of colours; ``references``/``chosen``: [{"label", "latency_ms",
    "expected_accept_length"}] markers, each chosen tree its own marker and colour, numbered
    beside it (``"tag"``, default its position); ``plain``: the plain-decoding point (one token
    per step, {"label", "latency_ms"}); ``note``: a line under the plot. Legends sit outside
    the axes.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(10.5, 5.6))
    buckets = max(len(series) - 1, 1)
    rates = []
    for i, item in enumerate(series):
        points = sorted(item["points"])
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        rates += [1000.0 * y / x for x, y in points if x > 0]
        if i == 0:
            style = {"color": "black", "linewidth": 2.0, "markersize": 3, "zorder": 3}
        else:
            style = {"color": plt.get_cmap("viridis")(0.9 * (i - 1) / max(buckets - 1, 1)),
                     "linewidth": 1.0, "markersize": 2, "alpha": 0.85}
        ax.plot(xs, ys, marker="o", label=item["label"], **style)
    for ref in references:
        ax.scatter([ref["latency_ms"]], [ref["expected_accept_length"]], marker="*", s=180,
                   color="black", zorder=5, label=ref["label"])
    if plain is not None:
        rates.append(1000.0 / plain["latency_ms"])
        ax.scatter([plain["latency_ms"]], [1.0], marker="X", s=90, color="0.35", zorder=5,
                   label=plain["label"])
    for i, pick in enumerate(chosen):
        marker = _CHOSEN_MARKERS[i % len(_CHOSEN_MARKERS)]
        color = _CHOSEN_COLORS[i % len(_CHOSEN_COLORS)]
        ax.scatter([pick["latency_ms"]], [pick["expected_accept_length"]], marker=marker,
                   s=max(220 - 40 * i, 60), facecolors="none", edgecolors=color,
                   linewidths=2.0, zorder=6 + i, label=pick["label"])
    ax.margins(x=0.06, y=0.08)
    _tag_chosen(ax, chosen)
    _iso_lines(ax, tokens_per_second_levels(rates))
    ax.set_xlabel("time of one draft + verify step (ms)")
    ax.set_ylabel("expected accepted tokens per step")
    ax.set_title(title, fontsize=10, loc="left")
    ax.grid(alpha=0.25)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
              frameon=False)
    if note:
        fig.text(0.01, -0.01, note, fontsize=8.5, ha="left", va="top", wrap=True)
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
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
              frameon=False)  # outside the axes: no curve under it
    return _save(fig, path)
