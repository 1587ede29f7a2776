"""What the commands that read a run's results take: a run folder or a bundle, whichever is
given, and the hints when neither fits, each naming the fix (a folder entmtp ships is never
offered as an output)."""

from __future__ import annotations

import difflib
import json
import os
from importlib import resources
from pathlib import Path

from entmtp.calibrate import RunDir
from entmtp.core import EntmtpError
from entmtp.treesearch import Bundle, LatencyModel, Profile

BUNDLE_FORMAT = "entmtp-bundle"  # a bundle file's "format"


def shipped_root() -> Path:
    """The data entmtp ships (trees/: bundles, profiles, latency files, heads)."""
    return Path(str(resources.files("entmtp.trees")))


def is_shipped(path: Path) -> bool:
    return path.resolve().is_relative_to(shipped_root().resolve())


def shown(path: Path) -> Path:
    """A path entmtp found (absolute) as a user types it here: relative to the working folder
    when under it. (Paths the user gave are shown as given.)"""
    try:
        return Path(os.path.relpath(path)) if path.resolve().is_relative_to(Path.cwd()) else path
    except ValueError:  # another drive
        return path


def is_bundle_file(path: Path) -> bool:
    """A JSON file whose ``format`` says it is a bundle (anything unreadable is not)."""
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(obj, dict) and obj.get("format") == BUNDLE_FORMAT


def bundle_in(folder: Path) -> Path | None:
    """The first bundle file directly in ``folder`` (a folder of bundles such as trees/bundles),
    or None."""
    return next((path for path in sorted(folder.glob("*.json")) if is_bundle_file(path)), None)


def folder_of_bundles(folder: Path) -> EntmtpError:
    """The error for a folder that holds bundles but is no run folder."""
    found = bundle_in(folder)
    example = folder / (found.name if found is not None else "NAME.json")
    return EntmtpError(f"{folder} holds bundles, not a calibration run: give one of them "
                       f"(e.g. {example}; `entmtp bundles` lists the shipped ones)")


def close_match(missing: Path) -> Path | None:
    """The bundle file or folder beside ``missing`` whose name is closest to its name, when one
    is close (a mistyped bundle name)."""
    folder = missing.parent
    try:
        names = [p.name for p in folder.iterdir() if p.is_dir() or p.suffix == ".json"]
    except OSError:
        return None
    found = difflib.get_close_matches(missing.name, names, n=1, cutoff=0.75)
    return folder / found[0] if found else None


def make_run_hint(folder: Path) -> str:
    """How to get a bundle.json into ``folder``: calibrate into it, unless entmtp ships it
    (then into a run folder of one's own)."""
    if is_shipped(folder):
        return ("it ships with entmtp: calibrate into a folder of your own (`entmtp calibrate "
                "--out runs/NAME`)")
    return f"run `entmtp calibrate --out {folder}`"


def resolve_bundle_path(source: Path) -> Path:
    """A bundle file, or a run folder holding bundle.json."""
    if source.is_dir():
        path = RunDir(source).bundle
        if path.exists():
            return path
        if bundle_in(source) is not None:
            raise folder_of_bundles(source)
        if is_shipped(source) and RunDir(source).profile.exists():
            made = sorted((shipped_root() / "bundles").glob(f"{source.name}-*.json"))
            example = f" (e.g. {shown(made[0])})" if made else ""
            raise EntmtpError(f"{source} is a shipped profile, not a run: give a bundle "
                              f"searched from it{example}, or make one with "
                              + retarget_hint(source, then_pareto=False))
        raise EntmtpError(f"{source} has no bundle.json: {make_run_hint(source)}")
    if not source.exists():
        near = close_match(source)
        hint = f" (did you mean {near}?)" if near is not None else ""
        raise EntmtpError(f"{source} does not exist{hint}: give a bundle.json or a run folder")
    return source


def retarget_hint(profile_folder: Path, latency: Path | None = None, name: str | None = None,
                  *, then_pareto: bool = True) -> str:
    """The command that searches a profile folder under a latency model into a run folder of
    one's own (and the one that shows its front)."""
    out = f"runs/{name or profile_folder.name}"
    latency_text = latency if latency is not None else "LATENCY.json"
    command = (f"`entmtp retarget {profile_folder} --latency {latency_text} --out "
               f"{out}`")
    return f"{command}, then `entmtp pareto {out}`" if then_pareto else command


def run_of_bundle(path: Path) -> RunDir | None:
    """The run folder a bundle file lies in as its bundle.json (with the front beside it)."""
    run = RunDir(path.parent)
    if path.name == run.bundle.name and run.front.exists():
        return run
    return None


def shipped_profile(bundle: Bundle) -> Path | None:
    """The shipped profile folder the bundle's trees were searched on: trees/profiles/TASK-TYPE
    when its profile was made with the bundle's heads."""
    folder = shipped_root() / "profiles" / f"{bundle.task}-{bundle.heads.type}"
    if not (folder / "profile.npz").is_file():
        return None
    try:
        meta = Profile.load(folder / "profile.npz").meta
    except EntmtpError:
        return None
    same = meta.heads_sha256.lower() == bundle.heads.sha256 and meta.task == bundle.task
    return shown(folder) if same else None


def shipped_latency(bundle: Bundle) -> Path | None:
    """The shipped latency file that holds the bundle's own latency model, if one does."""
    if bundle.latency is None:
        return None
    own = bundle.latency.to_json()
    for path in sorted((shipped_root() / "latency").glob("*.json")):
        try:
            if LatencyModel.load(path).to_json() == own:
                return shown(path)
        except EntmtpError:  # a batch file or another format: not this bundle's model
            continue
    return None


def bare_bundle(path: Path, bundle: Bundle) -> EntmtpError:
    """The error for ``pareto`` of a bundle without its run folder: how to get its front."""
    profile = shipped_profile(bundle)
    if profile is not None:
        fix = ("search its front again from its shipped profile: "
               + retarget_hint(profile, shipped_latency(bundle), path.stem))
    else:
        fix = "give the run folder it came from (entmtp calibrate --out)"
    return EntmtpError(f"{path} is a bundle without its run folder, and a bundle keeps its "
                       f"chosen trees, not the front: {fix}; `entmtp show-tree {path} "
                       "--out tree.png` draws its trees")
