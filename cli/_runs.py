"""A calibration run folder and its stages; each stage's file is written atomically last, so a
finished stage is reused by the next run of the same command and an interrupted one is redone."""

from __future__ import annotations

import hashlib
import json
import shlex
import sys
from dataclasses import asdict, dataclass
from importlib.metadata import version as _package_version
from pathlib import Path

from rich.console import Console

from entmtp.treesearch import (
    EntmtpError,
    LatencyModel,
    Profile,
    SearchSettings,
    load_bundle,
    make_bundle,
    save_bundle,
    search,
)
from entmtp.treesearch._atomic import atomic_write_json, atomic_write_text
from entmtp.treesearch._run import outcome_to_json, report_markdown


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


def entmtp_version() -> str:
    try:
        return _package_version("entmtp")
    except Exception:  # noqa: BLE001 - running from a source tree without metadata
        return "0+unknown"


def command_line() -> str:
    return " ".join(["entmtp", *map(shlex.quote, sys.argv[1:])])


def load_front(run: RunDir) -> dict:
    try:
        return json.loads(run.front.read_text())
    except FileNotFoundError as err:
        raise EntmtpError(
            f"{run.root} has no front.json: run `entmtp calibrate --out {run.root}` first"
        ) from err
    except (OSError, json.JSONDecodeError) as err:
        raise EntmtpError(f"{run.front} is unreadable ({err}); delete it and re-run") from err


def _inputs_digest(run: RunDir) -> str:
    """sha256 over the search stage's inputs: the profile and the latency model."""
    digest = hashlib.sha256()
    for path in (run.profile, run.latency):
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def search_stage(
    run: RunDir,
    settings: SearchSettings,
    *,
    console: Console,
    task: str,
    force: bool = False,
) -> Path:
    """profile.npz + latency.json -> front.json, acceptance.json, bundle.json, report.md.

    A finished stage is reused only when its settings and both input files are unchanged.
    """
    if not run.profile.exists():
        raise EntmtpError(f"{run.root} has no profile.npz: profile first (entmtp calibrate)")
    if not run.latency.exists():
        raise EntmtpError(f"{run.root} has no latency.json: measure latency first")
    stamp = {"settings": asdict(settings), "inputs": _inputs_digest(run)}
    if not force and run.bundle.exists() and run.front.exists():
        try:
            previous = json.loads(run.front.read_text())
        except (OSError, json.JSONDecodeError):
            previous = {}
        if all(previous.get(key) == value for key, value in stamp.items()):
            load_bundle(run.bundle)  # a finished stage must still be a valid bundle
            console.print(f"[dim]search: reusing {run.bundle}[/dim]")
            return run.bundle
    profile = Profile.load(run.profile)
    latency = LatencyModel.load(run.latency)
    with console.status(
        f"searching trees and schedule on {profile.num_positions} positions "
        f"({settings.schedule_trials} schedule trials)..."
    ):
        outcome = search(profile, latency, settings)
    bundle = make_bundle(
        outcome, profile, latency, command=command_line(), version=entmtp_version()
    )
    front = outcome_to_json(outcome, task=task)
    front.update(stamp)
    atomic_write_json(run.acceptance, outcome.acceptance.to_json())
    report = report_markdown(outcome, task=task, latency=latency, ranks=profile.ranks(),
                             topk=profile.meta.topk)
    atomic_write_text(run.report, report)
    save_bundle(bundle, run.bundle)
    atomic_write_json(run.front, front)  # written last: marks the stage finished
    return run.bundle
