"""`entmtp pareto` and `entmtp show-tree`: look at a run's fronts, chosen trees and curves."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from entmtp.calibrate import RunDir, load_acceptance, load_front, search_stage
from entmtp.core import EntmtpError, all_or_none, read_json
from entmtp.treesearch import Profile, SearchSettings, Tree, load_bundle

from ._errors import user_errors
from ._front_summary import (
    STATIC_NOTE,
    FrontView,
    bucket_label,
    bucket_table,
    entropy_range,
    front_table,
    load_view,
    plot_inputs,
    replay_table,
    schedule_heading,
    schedule_table,
    summary_rows,
)
from ._model_setup import FORCE_OPTION
from ._plots import check_plots, plot_acceptance_curves, plot_fronts, plot_tree
from ._progress import ConsoleReporter
from ._sources import (
    bare_bundle,
    bundle_in,
    close_match,
    folder_of_bundles,
    is_bundle_file,
    make_run_hint,
    resolve_bundle_path,
    run_of_bundle,
)
from ._typer_app import app


@app.command()
@user_errors
def pareto(
    run_dir: Path = typer.Argument(..., help="A calibration run folder (entmtp calibrate --out), "
                                   "or its bundle.json."),
    plot: Path | None = typer.Option(None, "--plot", help="Write the fronts as a plot (.png, "
                                     ".pdf or .svg)."),
    acceptance_plot: Path | None = typer.Option(
        None, "--acceptance-plot", help="Write acceptance-vs-entropy curves per head (.png, .pdf "
        "or .svg)."
    ),
    full: bool = typer.Option(False, "--full", help="Print every tree of every front, not a "
                              "summary of a few rows."),
    buckets: bool = typer.Option(True, help="Also print the front of each entropy bucket (a "
                                 "line each; with --full, every row)."),
    schedule_trials: int = typer.Option(
        150, "--schedule-trials", help="Used only when the run has no front.json yet."
    ),
    force: bool = FORCE_OPTION,
) -> None:
    """Print (and plot) the Pareto front of a run: accepted tokens per step vs step time.

    By default a summary: the front's first, last and fastest trees, one per power-of-two
    size, the chosen trees marked; --full prints every row.

    Example: entmtp pareto runs/code --plot runs/code/pareto.png
    """
    run = pareto_run(run_dir)
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
    view = load_view(run, front, score=plot is not None)
    _print_view(console, view, full=full, buckets=buckets)
    with all_or_none():  # both plots, or neither
        if plot is not None:
            plot_fronts(path=plot, **plot_inputs(view))
            console.print(f"wrote {plot}")
        if acceptance_plot is not None and acc is not None:
            top1 = acc.rank_probs[:, :, 0]  # [bucket, head]
            plot_acceptance_curves(list(acc.mean_entropy), top1.T.tolist(), acceptance_plot,
                                   title=f"head top-1 acceptance vs entropy, task {view.task}")
            console.print(f"wrote {acceptance_plot}")


def pareto_run(source: Path) -> RunDir:
    """The run folder of SOURCE: the folder itself, or the one a bundle.json lies in; a bare
    bundle, a folder of bundles or a missing folder is refused with the way to a front."""
    if source.is_file():
        if not is_bundle_file(source):
            raise EntmtpError(f"{source} is a file, not a run folder or a bundle: give the folder "
                              "that `entmtp calibrate` wrote, or its bundle.json")
        run = run_of_bundle(source)
        if run is None:
            raise bare_bundle(source, load_bundle(source))
        return run
    if not source.is_dir():
        near = close_match(source)
        hint = f" (did you mean {near}?)" if near is not None else ""
        raise EntmtpError(f"run folder {source} does not exist{hint}: {make_run_hint(source)}")
    run = RunDir(source)
    if not run.front.exists() and not run.profile.exists() and bundle_in(source) is not None:
        raise folder_of_bundles(source)
    return run


def _print_view(console: Console, view: FrontView, *, full: bool, buckets: bool) -> None:
    rows = view.front["front"]
    marks = view.marks()
    if full:
        console.print(front_table(f"Pareto front, task {view.task}, all positions", rows,
                                  marks=marks))
        edges = view.front.get("bucket_edges", [])
        for i, bucket_front in enumerate(view.front.get("bucket_fronts", []) if buckets else []):
            console.print(front_table(f"front of {bucket_label(edges, i)}", bucket_front))
    else:
        console.print(front_table(
            f"Pareto front, task {view.task}, all positions: {len(rows)} trees (--full: all "
            "rows)", rows, rows=summary_rows(rows, marks), marks=marks))
        if buckets and view.front.get("bucket_fronts"):
            console.print(bucket_table(view.front))
    table = schedule_table(view)
    console.print(table if table is not None else schedule_heading(view), highlight=False)
    console.print(replay_table(view))
    if view.static:
        console.print(STATIC_NOTE, highlight=False)


@app.command("show-tree")
@user_errors
def show_tree(
    source: Path = typer.Argument(..., help="A bundle.json or a run folder (its bundle.json), "
                                  "or a JSON list of paths."),
    out: Path = typer.Option(..., "--out", help="Plot to write (.png, .pdf or .svg)."),
    tree_index: int = typer.Option(0, "--tree", help="Which tree of a bundle."),
    force: bool = FORCE_OPTION,
) -> None:
    """Draw a tree (of a bundle, or a JSON path list such as trees/mc_sim_7b_63.json).

    Example: entmtp show-tree runs/code --tree 0 --out tree0.png

    Example: entmtp show-tree trees/mc_sim_7b_63.json --out mc_sim_7b_63.png
    """
    check_plots(out)
    if source.is_dir():
        source = resolve_bundle_path(source)
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
