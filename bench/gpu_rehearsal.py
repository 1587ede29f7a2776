"""The CPU rehearsal of bench/gpu_check.sh: every call of its plan, in order, on this machine,
as the GPU machine would run it, so that a missing piece fails here and not on a lease.

- The device's Python: a fresh venv with what the GPU image has of entmtp's needs and nothing
  it lacks (bench/gpu_plan.py: REHEARSAL_PACKAGES; the default-model package, optuna, gguf and
  jsonschema absent, checked by ``gpu_plan.py check-venv``), built once and reused while the
  package list is the same. pip installs it from the local sources its configuration names
  (file:// indexes, find-links folders: this machine's copy of the image's releases), offline;
  with none, from its usual index; REHEARSAL_PIP_ARGS replaces either.
- The operator's checkout: a copy of what a device call sends (tracked and untracked-not-ignored
  files) in a git repository of its own, so that ``prepare``, ``lean`` and ``full`` run as the
  operator runs them without touching this checkout's index.
- Each device call: a fresh folder holding only what that call sends (the copy's checkout as
  ``lean`` leaves it, and the carried paths; over 64 MiB fails as the device tool refuses it),
  /tmp a folder kept from call to call, $OUT one per call, the model hub offline, DEVICE=cpu, the
  smallest sizes, and DRY_RUN=1: nothing is timed, no stage is cut or skipped for time.

It prints each call with its exit status and the lines that say what failed, then the artefacts
of every stage (gpu_plan.py) missing from the archives the calls returned. Exit status: the
number of failures (calls that failed, stages with an artefact missing).

    bench/gpu_check.sh rehearse [--workdir DIR] [--venv DIR] [--fresh-venv]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_plan  # noqa: E402  (a bench script beside this one, not a package)

ROOT = Path(__file__).resolve().parent.parent
CALL_BYTES = 64 * 1024 * 1024  # what one device call carries at most
CALL_GUARD_S = 3600  # a rehearsal call's limit: only a guard against a hang, nothing is timed

# The smallest run of every stage (the knobs of bench/gpu_check.sh), on the CPU.
SIZES = {
    "DEVICE": "cpu", "DTYPE": "fp32", "TASKS": "code", "HEAD_TYPES": "medusa hydra",
    "PROMPTS": "1", "MAX_NEW_TOKENS": "4", "NODE_COUNTS": "0,1,3", "CONTEXT_LENGTHS": "64",
    "REPEATS": "1", "STATIC_CHECK_ARGS": "--tiny --rounds 1 --new-tokens 4 --prompts 1",
    "RETARGET_ARGS": "--max-nodes 3 --validation-folds 0", "LOW_PRECISION_PROMPTS": "1",
    "DRY_RUN": "1",
}
# What a device call's command finds: the variables the tool sets there, none of this machine's.
DROPPED = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHON", "PYTHONHOME", "ENTMTP_CACHE", "WHEELS", "OUT",
           "STAGE")
FAILURE = re.compile(r"failed|error|skipped|not found|no such|traceback|cannot|refus", re.I)


@dataclass(frozen=True)
class Outcome:
    call: gpu_plan.Call
    returncode: int
    log: Path


def travelling_files(checkout: Path) -> list[str]:
    """What a device call sends of ``checkout``: tracked and untracked-not-ignored files."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                             "--exclude-standard"], cwd=checkout, check=True,
                            capture_output=True).stdout.decode()
    return [path for path in listed.split("\0") if path and (checkout / path).is_file()]


def copy_paths(source: Path, paths: Sequence[str], target: Path) -> int:
    """Copy ``paths`` (files or folders under ``source``) to the same places under ``target``;
    the bytes copied."""
    copied = 0
    for path in paths:
        origin = source / path
        if origin.is_dir():
            shutil.copytree(origin, target / path, symlinks=True, dirs_exist_ok=True)
            copied += sum(f.stat().st_size for f in origin.rglob("*") if f.is_file())
        elif origin.is_file():
            (target / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, target / path)
            copied += origin.stat().st_size
    return copied


def operator_checkout(workdir: Path) -> Path:
    """A copy of this checkout as a device call would send it, committed in its own repository."""
    copy = workdir / "checkout"
    shutil.rmtree(copy, ignore_errors=True)
    copy.mkdir(parents=True)
    copy_paths(ROOT, travelling_files(ROOT), copy)
    git = ["git", "-c", "user.email=rehearsal@localhost", "-c", "user.name=rehearsal"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "rehearsal"]):
        subprocess.run(git + args, cwd=copy, check=True, capture_output=True)
    return copy


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def local_pip_sources(python: str) -> list[str]:
    """pip's arguments for the local package sources its configuration names, alone."""
    listed = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True,
                            text=True).stdout
    return pip_sources(listed)


def pip_sources(listed: str) -> list[str]:
    """From ``pip config list``'s lines: the file:// indexes and the find-links folders that
    exist, as pip arguments that use nothing else ([] when it names none)."""
    indexes, links = [], []
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        values = value.strip().strip("'\"").split()
        if key.endswith("index-url"):
            indexes += [url for url in values if url.startswith("file://")]
        elif key.endswith("find-links"):
            links += [link for link in values if Path(link.removeprefix("file://")).is_dir()]
    indexes, links = list(dict.fromkeys(indexes)), list(dict.fromkeys(links))
    if not indexes and not links:
        return []
    args = ["--index-url", indexes[0]] if indexes else ["--no-index"]
    for url in indexes[1:]:
        args += ["--extra-index-url", url]
    for link in links:
        args += ["--find-links", link]
    return args


def build_venv(venv: Path, base_python: str, fresh: bool) -> list[str]:
    """The rehearsal's venv (reused when built from the same list); the problems of its check."""
    marker = venv / "entmtp-rehearsal.json"
    given = os.environ.get("REHEARSAL_PIP_ARGS")
    pip_args = given.split() if given is not None else local_pip_sources(base_python)
    wanted = {"packages": list(gpu_plan.REHEARSAL_PACKAGES), "python": base_python,
              "pip": pip_args}
    current = json.loads(marker.read_text()) if marker.is_file() else None
    if fresh or current != wanted:
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([base_python, "-m", "venv", str(venv)], check=True)
        python = str(venv_python(venv))
        install = subprocess.run([python, "-m", "pip", "install", "-q", "--no-cache-dir",
                                  *pip_args, *gpu_plan.REHEARSAL_PACKAGES],
                                 stderr=subprocess.PIPE, text=True)
        if install.returncode == 0:
            marker.write_text(json.dumps(wanted))
        else:
            return [f"pip could not install the rehearsal's packages into {venv} (pip "
                    f"{' '.join(pip_args)}): {install.stderr.strip().splitlines()[-1:]}"]
    check = subprocess.run([str(venv_python(venv)), str(ROOT / "bench" / "gpu_plan.py"),
                            "check-venv"], capture_output=True, text=True)
    return check.stdout.splitlines() if check.returncode else []


def operator_env(python: str, wheels: Path | None) -> dict[str, str]:
    """The `here:` lines' environment: this machine's Python (the default-model package, the
    prompt data sets), wheels for the venv's Python version."""
    env = {**os.environ, "PYTHON": python, "PROMPTS": SIZES["PROMPTS"], "TASKS": SIZES["TASKS"]}
    if wheels is not None:
        env["WHEELS"] = str(wheels)
    return env


def device_env(venv: Path, workdir: Path, out: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in DROPPED}
    own = str(ROOT / ".venv" / "bin")
    path = [str(venv / "bin")] + [p for p in env.get("PATH", "").split(":") if p and p != own]
    home = workdir / "home"
    for folder in (home, workdir / "tmp", out):
        folder.mkdir(parents=True, exist_ok=True)
    env.update(SIZES)
    env.update({"PATH": ":".join(path), "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache"),
                "HF_HOME": str(home / "hf"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                "MPLBACKEND": "Agg", "TMPDIR": str(workdir / "tmp"),
                "STAGE": str(workdir / "tmp" / "entmtp-gpu"), "OUT": str(out)})
    return env


def run_logged(command: str, cwd: Path, env: Mapping[str, str], log: Path) -> int:
    with log.open("w", encoding="utf-8") as handle:
        try:
            return subprocess.run(["bash", "-c", command], cwd=cwd, env=dict(env),
                                  stdout=handle, stderr=subprocess.STDOUT,
                                  timeout=CALL_GUARD_S).returncode
        except subprocess.TimeoutExpired:
            handle.write(f"\nrehearsal: stopped after its {CALL_GUARD_S} s guard\n")
            return 124


def device_call(call: gpu_plan.Call, index: int, checkout: Path, workdir: Path,
                venv: Path) -> Outcome:
    """One device call: a fresh folder with what the call sends, its command run there."""
    device = workdir / "device"
    shutil.rmtree(device, ignore_errors=True)
    device.mkdir()
    log = workdir / "logs" / f"call{index}.log"
    sent = copy_paths(checkout, travelling_files(checkout), device)
    sent += copy_paths(checkout, call.carry, device)
    absent = [path for path in call.carry if not (checkout / path).exists()]
    if sent >= CALL_BYTES or absent:
        log.write_text(f"the call sends {sent} bytes (at most {CALL_BYTES}); carried paths "
                       f"not here: {', '.join(absent) or 'none'}\n")
        return Outcome(call, 2, log)
    out = workdir / "out" / f"call{index}"
    shutil.rmtree(out, ignore_errors=True)
    return Outcome(call, run_logged(call.command, device, device_env(venv, workdir, out), log),
                   log)


def returned_results(workdir: Path) -> dict[str, Path]:
    """The phases' results as their archives brought them back: phase -> results folder."""
    found = {}
    for phase, archive in (("first", "gpu-check-first.tgz"), ("run", "gpu-check.tgz")):
        for path in sorted((workdir / "out").glob(f"call*/{archive}")):
            target = workdir / "returned" / phase
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            with tarfile.open(path) as tar:
                tar.extractall(target, filter="data")
            found[phase] = target / "results"
    return found


def missing_artefacts(results: Mapping[str, Path], checkout: Path) -> dict[str, list[str]]:
    """Per stage, its artefacts that no returned archive of its phase holds."""
    tasks, head_types = SIZES["TASKS"].split(), SIZES["HEAD_TYPES"].split()
    absent = {}
    for stage in gpu_plan.STAGES:
        folder = results.get(stage.phase)
        paths = gpu_plan.artefacts([stage.name], tasks, head_types, checkout / "trees" / "profiles")
        lost = paths if folder is None else gpu_plan.missing(
            folder, [stage.name], tasks, head_types, checkout / "trees" / "profiles")
        if lost:
            absent[stage.name] = lost
    return absent


def failure_lines(log: Path, limit: int = 12) -> list[str]:
    lines = [line.rstrip() for line in log.read_text(errors="replace").splitlines()
             if FAILURE.search(line)]
    return lines[:limit]


def rehearse(workdir: Path, venv: Path, fresh_venv: bool, python: str) -> int:
    for folder in ("logs", "out", "returned", "tmp", "home"):
        shutil.rmtree(workdir / folder, ignore_errors=True)
        (workdir / folder).mkdir(parents=True)
    base = os.environ.get("REHEARSAL_PYTHON") or getattr(sys, "_base_executable", sys.executable)
    problems = build_venv(venv, base, fresh_venv)
    verdict = "NOT like the GPU image" if problems else "what the GPU image has, nothing it lacks"
    print(f"rehearsal venv {venv}: {verdict}")
    for problem in problems:
        print(f"  {problem}")
    if problems:
        return len(problems)
    version = subprocess.run([str(venv_python(venv)), "-c", "import sys; print("
                              "f'{sys.version_info[0]}.{sys.version_info[1]}')"],
                             capture_output=True, text=True, check=True).stdout.strip()
    checkout = operator_checkout(workdir)
    wheels = workdir / f"whl-cp{version.replace('.', '')}"
    env = operator_env(python, wheels if wheels.is_dir() else None)
    env["WHEEL_PYTHON"] = version
    prepare = gpu_plan.Call("bench/gpu_check.sh prepare", here=True)
    outcomes = [Outcome(prepare, run_logged(prepare.command, checkout, env,
                                            workdir / "logs" / "prepare.log"),
                        workdir / "logs" / "prepare.log")]
    if outcomes[0].returncode == 0:
        if not wheels.is_dir():
            shutil.copytree(checkout / ".gpu" / "whl", wheels)
        calls = gpu_plan.parse_calls((checkout / ".gpu" / "calls.txt").read_text())
        for index, call in enumerate(calls, start=1):
            if call.here:
                log = workdir / "logs" / f"here{index}.log"
                outcomes.append(Outcome(call, run_logged(call.command, checkout, env, log), log))
            else:
                outcomes.append(device_call(call, index, checkout, workdir, venv))
    failures = 0
    for outcome in outcomes:
        where = "here" if outcome.call.here else "device"
        state = "ok" if outcome.returncode == 0 else f"FAILED (exit {outcome.returncode})"
        print(f"{where}: {outcome.call.command}: {state}   [log {outcome.log}]")
        if outcome.returncode != 0:
            failures += 1
            for line in failure_lines(outcome.log):
                print(f"    {line}")
    absent = missing_artefacts(returned_results(workdir), checkout)
    for name, paths in absent.items():
        print(f"stage {name}: missing {', '.join(paths)}")
    failures += len(absent)
    print(f"rehearsal: {failures} failure(s)" + ("" if failures else
                                                  ": every call ran and every artefact came back"))
    return failures


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/gpu_check.sh rehearse")
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    parser.add_argument("--workdir", type=Path, default=tmp / "entmtp-rehearsal")
    parser.add_argument("--venv", type=Path, default=tmp / "entmtp-rehearsal-venv")
    parser.add_argument("--fresh-venv", action="store_true", help="build the venv anew")
    args = parser.parse_args(argv)
    if shutil.which("git") is None:
        print("error: the rehearsal needs git (it plans the calls in a copy of the checkout)",
              file=sys.stderr)
        return 2
    return rehearse(args.workdir.resolve(), args.venv.resolve(), args.fresh_venv,
                    os.environ.get("PYTHON") or sys.executable)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
