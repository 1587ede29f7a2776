"""A calibration run folder: where each stage's file lies, the arguments that made it, and the
readers of its search files. Each stage's file is written atomically last, so a finished stage is
reused by the next run of the same command and an interrupted one is redone (``_pipeline``)."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from entmtp.core import (
    EntmtpError,
    atomic_write_json,
    check_output_folder,
    check_writable_target,
    read_json,
    read_text,
    require,
    short,
)
from entmtp.treesearch import AcceptanceTable, Profile


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def profile(self) -> Path:
        return self.root / "profile.npz"

    @property
    def shards(self) -> Path:
        return self.root / "shards"

    @property
    def latency(self) -> Path:
        return self.root / "latency.json"

    @property
    def front(self) -> Path:
        return self.root / "front.json"

    @property
    def acceptance(self) -> Path:
        return self.root / "acceptance.json"

    @property
    def bundle(self) -> Path:
        return self.root / "bundle.json"

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    @property
    def record(self) -> Path:
        """The arguments that made the run (``check_run_arguments``)."""
        return self.root / "run.json"

    def shard_profile(self, num_shards: int, shard_index: int) -> Path:
        """One shard's profile, merged into ``profile`` once every shard has written its own."""
        return self.root / f"profile-shard{shard_index}-of-{num_shards}.npz"

    def shard_prompts(self, num_shards: int, shard_index: int) -> Path:
        """The folder of one shard's per-prompt traces (a killed profile resumes from them)."""
        return self.shards / f"{shard_index}-of-{num_shards}"


def check_run_outputs(run: RunDir) -> None:
    """Refuse, before anything is written, a run folder that is a link or a file, or whose
    stage files are folders, links or devices. (A read-only stage file is refused only when its
    stage is to be written again: a finished read-only run is still reused.)"""
    check_output_folder(run.root, what="run folder")
    check_output_folder(run.shards, what="folder of finished prompts")
    for path in (run.record, run.profile, run.latency, run.front, run.acceptance, run.bundle,
                 run.report):
        check_writable_target(path, replace_read_only=True)


@contextlib.contextmanager
def removed_on_failure(folder: Path) -> Iterator[None]:
    """If the block fails, remove ``folder`` and its parents that did not exist before it: a
    half-made run folder (a profile without a bundle) helps nobody (demo, retarget)."""
    missing = missing_folders(folder)
    try:
        yield
    except BaseException:
        if missing:
            shutil.rmtree(missing[-1], ignore_errors=True)
        raise


def missing_folders(folder: Path) -> list[Path]:
    """``folder`` and its parents that do not exist, deepest first."""
    missing = []
    probe = folder.absolute()
    while not probe.exists() and not probe.is_symlink() and probe.parent != probe:
        missing.append(probe)
        probe = probe.parent
    return missing


def shipped_path(*parts: str) -> Path:
    """A path in the data entmtp ships (trees/), relative to the working folder when under it
    (as a user of a clone types it)."""
    path = Path(str(resources.files("entmtp.trees"))).joinpath(*parts)
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def is_shipped(folder: Path) -> bool:
    """``folder`` lies in the data entmtp ships (trees/), which no command writes into."""
    try:
        shipped = shipped_path()
    except ModuleNotFoundError:  # pragma: no cover - a broken install
        return False
    return folder.resolve().is_relative_to(shipped.resolve())


def calibrate_fix(run: RunDir, *, again: bool = False) -> str:
    """The command that makes ``run``'s files (``again``: anew, deleting the damaged one); for a
    folder entmtp ships, which no command writes into, a run folder of one's own instead."""
    if is_shipped(run.root):
        return ("it ships with entmtp, and no command writes into it: calibrate into a run "
                "folder of your own (`entmtp calibrate --out runs/NAME`)"
                + (", or reinstall entmtp" if again else ""))
    if again:
        return f"delete it and re-run `entmtp calibrate --out {run.root}`"
    return f"run `entmtp calibrate --out {run.root}` first"


def check_report(run: RunDir) -> None:
    """A finished search's report.md must be text with something in it."""
    if not read_text(run.report, source=f"report {run.report}").strip():
        raise EntmtpError(f"{run.report} is empty")


# What a profile folder's front.json holds (trees/profiles/): the search's header alone.
HEADER_KEYS = frozenset({"format", "task", "settings"})


def _read_front(run: RunDir) -> tuple[dict, str, str]:
    """``front.json`` as read (not checked), with the source and fix its messages name."""
    if not run.front.exists() and not run.front.is_symlink():
        raise EntmtpError(f"{run.root} has no front.json: {calibrate_fix(run)}")
    source = f"front file {run.front}"
    fix = calibrate_fix(run, again=True)
    return read_json(run.front, source=source, fix=fix), source, fix


def load_front(run: RunDir) -> dict:
    """``front.json``, checked for every field ``pareto`` and ``retarget`` read. A profile
    folder's front.json (trees/profiles/) holds only the search settings: its front is found by
    searching the profile under a latency model, into a run folder of one's own."""
    front, source, fix = _read_front(run)
    if isinstance(front, dict) and "front" not in front and set(front) <= HEADER_KEYS:
        raise EntmtpError(
            f"{run.root} holds a profile and its search settings, not a searched front: search "
            f"it under a latency model first (`entmtp retarget {run.root} --latency LATENCY.json "
            "--out runs/NAME`; `entmtp latency` measures one, trees/latency/ ships some), then "
            "give that run folder")
    check_front(front, source=source, fix=fix)
    return front


def load_front_header(run: RunDir) -> dict:
    """``front.json``'s format, task and search settings: all a re-search reads. A shipped
    profile folder (trees/profiles/) holds only these, not the front found on the old hardware;
    a front that holds more is checked whole, as ``load_front`` does."""
    front, source, fix = _read_front(run)
    if set(front) - HEADER_KEYS:  # a search's whole front: every part must be sound
        check_front(front, source=source, fix=fix)
    elif front.get("format", "entmtp-front") != "entmtp-front":
        raise EntmtpError(f"{source}: format {front.get('format')!r} is not 'entmtp-front': {fix}")
    if "task" in front:
        require(front, "task", str, source=source, fix=fix)
    require(front, "settings", dict, source=source, fix=fix)
    return front


def check_front(front: dict, *, source: str, fix: str) -> None:
    number = (int, float)

    def candidates(values: object, where: str) -> None:
        if not isinstance(values, list):
            raise EntmtpError(f"{source}: {where} is not a list: {fix}")
        for i, candidate in enumerate(values):
            name = f"{where}[{i}]"
            if not isinstance(candidate, dict):
                raise EntmtpError(f"{source}: {name} is not an object: {fix}")
            for key in ("num_nodes", "depth"):
                require(candidate, key, int, source=source, fix=fix, where=name)
            for key in ("expected_accept_length", "latency_ms"):
                if require(candidate, key, number, source=source, fix=fix, where=name) < 0:
                    raise EntmtpError(f"{source}: {name}.{key} is negative: {fix}")

    if front.get("format", "entmtp-front") != "entmtp-front":
        raise EntmtpError(f"{source}: format {front.get('format')!r} is not 'entmtp-front': {fix}")
    candidates(require(front, "front", list, source=source, fix=fix), "front")
    for i, bucket in enumerate(front.get("bucket_fronts", [])
                               if isinstance(front.get("bucket_fronts", []), list) else [None]):
        candidates(bucket, f"bucket_fronts[{i}]")
    edges = front.get("bucket_edges", [])
    if not isinstance(edges, list) or not all(
            isinstance(e, number) and not isinstance(e, bool) for e in edges):
        raise EntmtpError(f"{source}: bucket_edges is not a list of numbers: {fix}")
    references = front.get("references", [])
    if not isinstance(references, list):
        raise EntmtpError(f"{source}: references is not a list: {fix}")
    candidates(references, "references")
    for i, reference in enumerate(references):
        require(reference, "name", str, source=source, fix=fix, where=f"references[{i}]")
    schedule = require(front, "schedule", dict, source=source, fix=fix)
    require(schedule, "trees", list, source=source, fix=fix, where="schedule")
    thresholds = require(schedule, "thresholds", list, source=source, fix=fix, where="schedule")
    if not all(isinstance(t, number) and not isinstance(t, bool) for t in thresholds):
        raise EntmtpError(f"{source}: schedule.thresholds is not a list of numbers: {fix}")
    for name, where in (("schedule", schedule), ("best_static", None), ("oracle", None)):
        part = where if where is not None else require(front, name, dict, source=source, fix=fix)
        replayed = require(part, "replayed", dict, source=source, fix=fix, where=name)
        require(replayed, "tokens_per_second", number, source=source, fix=fix,
                where=f"{name}.replayed")
    if "task" in front:
        require(front, "task", str, source=source, fix=fix)
    if "settings" in front:
        require(front, "settings", dict, source=source, fix=fix)


def load_acceptance(run: RunDir) -> AcceptanceTable:
    source = f"acceptance file {run.acceptance}"
    fix = calibrate_fix(run, again=True)
    if not run.acceptance.exists():
        raise EntmtpError(f"{run.acceptance} is missing: re-run the search stage: "
                          f"{calibrate_fix(run)}")
    obj = read_json(run.acceptance, source=source, fix=fix)
    try:
        return AcceptanceTable.from_json(obj)
    except EntmtpError as err:
        raise EntmtpError(f"{source}: {err}: {fix}") from err


# -- the arguments a run folder was made with -------------------------------------------------
RUN_RECORD_FORMAT = "entmtp-run"
_OPTION_OF = {"max_new_tokens": "--max-new-tokens", "head_type": "--head-type",
              "data_sha256": "--data (its contents)"}
# What a profile records of the arguments: checked for run folders made before run.json.
_PROFILE_FIELDS = ("task", "topk", "split", "max_new_tokens", "seed", "head_type")


def normalized_arguments(arguments: dict) -> dict:
    """Paths made absolute and the --data file's sha256 added, so that a run is recognised
    from any working folder and an edited data file is not taken for the same one."""
    out = dict(arguments)
    for key in ("model", "heads", "data"):
        value = out.get(key)
        if value is not None and Path(value).expanduser().exists():
            out[key] = str(Path(value).expanduser().resolve())
    if out.get("data") is not None:
        out["data_sha256"] = hashlib.sha256(Path(out["data"]).read_bytes()).hexdigest()
    return out


def _option(key: str) -> str:
    return _OPTION_OF.get(key, "--" + key.replace("_", "-"))


def check_run_arguments(run: RunDir, arguments: dict, *, fresh: bool) -> None:
    """Refuse to reuse a run folder made with other arguments (``--fresh`` starts it again)."""
    if fresh or not run.root.is_dir():
        return
    wanted = normalized_arguments(arguments)
    fix = (f"choose another --out, or pass --fresh to delete {run.root}'s profile, latency and "
           "search files and start again")
    if run.record.exists() or run.record.is_symlink():
        source = f"run record {run.record}"
        record_fix = f"delete it if {run.root} was made with this command's arguments"
        record = read_json(run.record, source=source, fix=record_fix)
        if record.get("format") != RUN_RECORD_FORMAT:
            raise EntmtpError(f"{source}: format {short(repr(record.get('format')))} is not "
                              f"{RUN_RECORD_FORMAT!r}: {record_fix}")
        made_with = require(record, "arguments", dict, source=source, fix=fix)
    elif run.profile.exists():  # a run from before run.json: its profile says what made it
        meta = Profile.load(run.profile).meta
        made_with = {key: getattr(meta, key) for key in _PROFILE_FIELDS}
        wanted = {key: wanted[key] for key in _PROFILE_FIELDS}
    else:
        return
    differ = [key for key in wanted if made_with.get(key) != wanted[key]]
    if differ:
        old = " ".join(f"{_option(k)} {made_with.get(k)}" for k in differ)
        new = " ".join(f"{_option(k)} {wanted[k]}" for k in differ)
        raise EntmtpError(f"run folder {run.root} was made with {old}, not {new}: {fix}")


def record_run_arguments(run: RunDir, arguments: dict) -> None:
    record = {"format": RUN_RECORD_FORMAT, "arguments": normalized_arguments(arguments)}
    if not run.record.exists():
        atomic_write_json(run.record, record)


def start_afresh(run: RunDir) -> None:
    """Delete what the stages of a run wrote (``calibrate --fresh``)."""
    for path in (run.record, run.profile, run.latency, run.front, run.acceptance, run.bundle,
                 run.report, *run.root.glob("profile-shard*-of-*.npz")):
        path.unlink(missing_ok=True)
    if run.shards.is_dir():
        shutil.rmtree(run.shards)


def remove_stale_temp_files(run: RunDir, num_shards: int, shard_index: int) -> None:
    """Delete temp files that a killed atomic write of this shard's run left behind.

    Only this shard's own targets: another shard may be writing its files right now.
    """
    if num_shards == 1:
        targets = [run.profile, run.latency, run.front, run.acceptance, run.bundle, run.report,
                   run.record]
    else:
        targets = [run.shard_profile(num_shards, shard_index)]
    patterns = [f".{target.name}.*.tmp" for target in targets]
    folders = [(run.root, pattern) for pattern in patterns]
    folders.append((run.shard_prompts(num_shards, shard_index), ".prompt-*.npz.*.tmp"))
    for folder, pattern in folders:
        for stale in folder.glob(pattern):
            stale.unlink(missing_ok=True)


def inputs_digest(run: RunDir) -> str:
    """sha256 over the search stage's inputs: the profile and the latency model."""
    digest = hashlib.sha256()
    for path in (run.profile, run.latency):
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


