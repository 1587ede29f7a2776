"""`entmtp pareto` and `entmtp show-tree`: look at a run's fronts, chosen trees and curves."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from entmtp.calibrate import RunDir, load_acceptance, load_front, search_stage
from entmtp.core import EntmtpError, all_or_none, read_json
from entmtp.treesearch import Profile, SearchSettings, Tree, load_bundle

from ._errors import user_errors
from ._model_setup import FORCE_OPTION
from ._plots import check_plots, plot_acceptance_curves, plot_fronts, plot_tree
from ._progress import ConsoleReporter
from ._typer_app import app


def _front_table(title: str, front: list[dict]) -> Table:
    table = Table(title=title, title_justify="left")
    for name in ("nodes", "depth", "accept len", "latency ms", "tokens/s", "source"):
        table.add_column(name, justify="right" if name != "source" else "left")
    for c in front:
        tps = 1000.0 * c["expected_accept_length"] / c["latency_ms"] if c["latency_ms"] else 0.0
        table.add_row(str(c["num_nodes"]), str(c["depth"]), f"{c['expected_accept_length']:.3f}",
                      f"{c['latency_ms']:.2f}", f"{tps:.2f}", c.get("source", ""))
    return table


def _bucket_label(edges: list[float], index: int) -> str:
    low = edges[index - 1] if index > 0 else float("-inf")
    high = edges[index] if index < len(edges) else float("inf")
    return f"entropy [{low:.2f}, {high:.2f})"


@app.command()
@user_errors
def pareto(
    run_dir: Path = typer.Argument(..., help="A calibration run folder (entmtp calibrate --out)."),
    plot: Path | None = typer.Option(None, "--plot", help="Write the fronts as a plot (.png, "
                                     ".pdf or .svg)."),
    acceptance_plot: Path | None = typer.Option(
        None, "--acceptance-plot", help="Write acceptance-vs-entropy curves per head (.png, .pdf "
        "or .svg)."
    ),
    buckets: bool = typer.Option(True, help="Also print the front of each entropy bucket."),
    schedule_trials: int = typer.Option(
        150, "--schedule-trials", help="Used only when the run has no front.json yet."
    ),
    force: bool = FORCE_OPTION,
) -> None:
    """Print (and plot) the Pareto front of a run: accept length vs verification latency.

    Example: entmtp pareto runs/code --plot runs/code/pareto.png
    """
    run = RunDir(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise EntmtpError(f"{run_dir} is a file, not a run folder: give the folder that "
                          "`entmtp calibrate` wrote")
    if not run_dir.is_dir():
        raise EntmtpError(f"run folder {run_dir} does not exist: run `entmtp calibrate` first")
    check_plots(plot, acceptance_plot)
    console = Console()
    if not run.front.exists() and run.profile.exists() and run.latency.exists():
        # A folder with only a profile and a latency model: run the search stage now.
        task = Profile.load(run.profile).meta.task or "custom"
        with ConsoleReporter(console) as reporter:
            search_stage(run, SearchSettings(schedule_trials=schedule_trials),
                         progress=reporter, task=task)
    front = load_front(run)
    acc = load_acceptance(run) if acceptance_plot is not None else None  # before any plot
    task = front.get("task", "?")
    console.print(_front_table(f"Pareto front, task {task}, all positions", front["front"]))
    edges = front.get("bucket_edges", [])
    if buckets:
        for i, bucket_front in enumerate(front.get("bucket_fronts", [])):
            console.print(_front_table(f"bucket {i}: {_bucket_label(edges, i)}", bucket_front))
    schedule = front["schedule"]
    console.print(
        f"chosen schedule: {len(schedule['trees'])} tree(s), thresholds "
        f"{[round(t, 3) for t in schedule['thresholds']]}, estimator {schedule['estimator']}; "
        f"replayed {schedule['replayed']['tokens_per_second']:.2f} tokens/s vs best static "
        f"{front['best_static']['replayed']['tokens_per_second']:.2f} vs oracle "
        f"{front['oracle']['replayed']['tokens_per_second']:.2f}"
    )
    with all_or_none():  # both plots, or neither
        if plot is not None:
            points = [(c["latency_ms"], c["expected_accept_length"]) for c in front["front"]]
            series = [{"label": "all positions", "points": points}]
            for i, bucket_front in enumerate(front.get("bucket_fronts", [])):
                series.append({"label": f"bucket {i}: {_bucket_label(edges, i)}",
                               "points": [(c["latency_ms"], c["expected_accept_length"])
                                          for c in bucket_front]})
            references = [{"label": r["name"], "latency_ms": r["latency_ms"],
                           "expected_accept_length": r["expected_accept_length"]}
                          for r in front.get("references", [])]
            chosen = []
            if run.bundle.exists():
                bundle = load_bundle(run.bundle)
                pairs = zip(bundle.trees, bundle.tree_stats, strict=True)
                for i, (tree, stats) in enumerate(pairs):
                    label = f"chosen tree {i} ({tree.num_nodes} nodes, on its positions)"
                    chosen.append({"label": label,
                                   "latency_ms": stats.latency_ms,
                                   "expected_accept_length": stats.expected_accept_length})
            plot_fronts(series, plot, title=f"entmtp Pareto fronts, task {task}",
                        references=references, chosen=chosen)
            console.print(f"wrote {plot}")
        if acceptance_plot is not None and acc is not None:
            top1 = acc.rank_probs[:, :, 0]  # [bucket, head]
            plot_acceptance_curves(list(acc.mean_entropy), top1.T.tolist(), acceptance_plot,
                                   title=f"head top-1 acceptance vs entropy, task {task}")
            console.print(f"wrote {acceptance_plot}")


@app.command("show-tree")
@user_errors
def show_tree(
    source: Path = typer.Argument(..., help="A bundle.json, or a JSON list of paths."),
    out: Path = typer.Option(..., "--out", help="Plot to write (.png, .pdf or .svg)."),
    tree_index: int = typer.Option(0, "--tree", help="Which tree of a bundle."),
    force: bool = FORCE_OPTION,
) -> None:
    """Draw a tree (of a bundle, or a JSON path list such as trees/mc_sim_7b_63.json).

    Example: entmtp show-tree runs/code/bundle.json --tree 0 --out tree0.png
    """
    check_plots(out)
    obj = read_json(source, source=f"tree file {source}", expect=(dict, list),
                    fix="give a bundle.json or a JSON list of paths")
    serves = None
    if isinstance(obj, dict) and obj.get("format") == "entmtp-bundle":
        bundle = load_bundle(source)
        if not 0 <= tree_index < len(bundle.trees):
            raise EntmtpError(f"--tree {tree_index} is out of range: the bundle has "
                              f"{len(bundle.trees)} trees")
        tree = bundle.trees[tree_index]
        serves = f"tree {tree_index} of {len(bundle.trees)}, " + entropy_range(
            bundle.schedule(), tree_index)
    elif isinstance(obj, dict) and not {"paths", "medusa_choices"} & set(obj):
        kind = f"an {obj['format']} file" if isinstance(obj.get("format"), str) else "an object"
        raise EntmtpError(f"tree file {source} is {kind}, not a bundle or a list of paths: give "
                          "a bundle.json or a JSON list of paths")
    else:
        tree = Tree.from_json(obj)
    title = f"{source.name}: {tree.num_nodes} nodes, depth {tree.depth}"
    if serves is not None:
        title = f"{source.name}, {serves}\n{tree.num_nodes} nodes, depth {tree.depth}"
    plot_tree(tree.to_json(), out, title=title)
    typer.echo(f"wrote {out}")


def entropy_range(schedule, index: int) -> str:
    """The estimates tree ``index`` of ``schedule`` serves, in words: ``[low, high)`` nats of
    its signal, or every step for a one-tree schedule."""
    if len(schedule.trees) == 1:
        return "every step"
    signal = schedule.signal.replace("_", " ")
    low = schedule.thresholds[index - 1] if index > 0 else None
    high = schedule.thresholds[index] if index < len(schedule.thresholds) else None
    if low is not None and high is not None and low >= high:
        return f"never chosen ({signal} thresholds {low:.2f} = {high:.2f} nats)"
    if low is None:
        return f"{signal} < {high:.2f} nats"
    if high is None:
        return f"{signal} >= {low:.2f} nats"
    return f"{low:.2f} <= {signal} < {high:.2f} nats"
