"""bench/gpu_check.sh's results beside the measurements: the prompts each bench ran (said when
fewer than the issue's 10) and the PNG of the latency curves, through the script's functions."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def functions(script: str, results: Path, **env: str) -> subprocess.CompletedProcess:
    """``script`` after ``source bench/gpu_check.sh functions``, with ``results`` its results
    folder, run from the checkout ($0 under bench/, as the script's own cd expects)."""
    assignments = " ".join(f"{key}={value}" for key, value in
                           {"results": str(results), **env}.items())
    return subprocess.run(["bash", "-c", f"source bench/gpu_check.sh functions && "
                           f"{assignments} && {script}", "bench/test"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_the_summary_says_how_many_prompts_each_bench_ran(tmp_path):
    (tmp_path / "bench").mkdir()
    for task, count in (("code", 10), ("math", 9), ("lit", 12)):
        (tmp_path / "bench" / f"{task}.json").write_text(json.dumps({"prompts": count}))
    run = functions("bench_summary code $results/bench/code.json && "
                    "bench_summary math $results/bench/math.json && "
                    "bench_summary chat none && bench_summary lit $results/bench/lit.json",
                    tmp_path, PY=sys.executable, MAX_NEW_TOKENS="128")
    assert run.returncode == 0, run.stderr
    short = ", fewer than the 10 the issue asks for"
    lines = ["bench code: 10 held-out prompts x 128 new tokens",
             "bench math: 9 held-out prompts x 128 new tokens" + short,
             "bench chat: no report (skipped or failed): 0 prompts" + short,
             "bench lit: 12 held-out prompts x 128 new tokens"]
    assert (tmp_path / "bench" / "summary.txt").read_text().splitlines() == lines
    assert run.stderr.splitlines() == [lines[1], lines[2]]  # printed: the shortfalls only


def test_the_latency_curves_come_with_a_png(tmp_path):
    if shutil.which("timeout") is None:
        pytest.skip("no timeout(1)")
    (tmp_path / "latency").mkdir()
    for head_type in ("medusa", "hydra"):
        shutil.copy(ROOT / "trees" / "latency" / f"cpu2-{head_type}-smollm2-135m.json",
                    tmp_path / "latency" / f"{head_type}.json")
    # the latency stage as it is, its measurement stood in for by the curves above
    skip_measuring = ('timeout() { [[ $5 == latency ]] || command timeout "$@"; } && '
                      "python_for_entmtp && deadline=$((SECONDS + 200)) && model_free_stages")
    run = functions(skip_measuring, tmp_path, TASKS="''")
    assert run.returncode == 0, run.stderr
    png = tmp_path / "latency" / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    png.unlink()  # no curve measured: no plot, no error
    for curve in (tmp_path / "latency").iterdir():
        curve.unlink()
    run = functions("python_for_entmtp && deadline=$((SECONDS + 200)) && plot_curves",
                    tmp_path)
    assert run.returncode == 0 and "failed" not in run.stderr, run.stderr
    assert not png.exists()
