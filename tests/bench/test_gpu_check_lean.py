"""bench/gpu_check.sh lean / full: the heads folders leave the index and come back exactly."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.sh"


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                          text=True).stdout


def travels(repo: Path) -> list[str]:
    """What a device call carries: tracked and untracked-not-ignored files."""
    return sorted(git(repo, "ls-files", "--cached", "--others", "--exclude-standard").split())


@pytest.fixture
def repo(tmp_path) -> Path:
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    repo = tmp_path / "repo"
    (repo / "bench").mkdir(parents=True)
    shutil.copy(SCRIPT, repo / "bench" / "gpu_check.sh")
    for path, text in {"trees/heads/a/heads.safetensors": "weights",
                       "trees/heads/README.md": "heads", "trees/profiles/p.npz": "profile",
                       "README.md": "top"}.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git(repo, "init", "-q")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "add", "-A")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "init")
    (repo / ".git" / "info").mkdir(exist_ok=True)
    (repo / ".git" / "info" / "exclude").write_text("/.gpu/\n")
    (repo / ".gpu").mkdir()
    (repo / ".gpu" / "calls.txt").write_text("bench/gpu_check.sh run\n")
    return repo


def phase(repo: Path, name: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "bench/gpu_check.sh", name], cwd=repo, capture_output=True,
                          text=True)


def test_lean_leaves_the_heads_out_of_every_call_and_full_restores_the_index(repo):
    before = travels(repo)
    exclude = (repo / ".git" / "info" / "exclude").read_text()
    assert phase(repo, "lean").returncode == 0
    assert travels(repo) == ["README.md", "bench/gpu_check.sh", "trees/profiles/p.npz"]
    assert (repo / "trees/heads/a/heads.safetensors").read_text() == "weights"  # files kept
    assert phase(repo, "prepare").returncode == 2  # refused while lean
    commit = subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q",
                             "-m", "would delete the heads"], cwd=repo, capture_output=True,
                            text=True)
    assert commit.returncode != 0 and "lean" in commit.stderr  # refused while lean
    assert phase(repo, "full").returncode == 0
    assert not (repo / ".git" / "hooks" / "pre-commit").exists()
    assert travels(repo) == before
    assert git(repo, "status", "--porcelain") == ""
    assert (repo / ".git" / "info" / "exclude").read_text() == exclude
    assert phase(repo, "full").returncode == 0  # idempotent


def test_lean_refuses_changed_heads_and_an_unprepared_checkout(repo):
    (repo / "trees/heads/README.md").write_text("edited")
    assert phase(repo, "lean").returncode == 2
    (repo / "trees/heads/README.md").write_text("heads")
    (repo / ".gpu" / "calls.txt").unlink()
    result = phase(repo, "lean")
    assert result.returncode == 2 and "prepare" in result.stderr
    assert git(repo, "status", "--porcelain") == ""
