"""The documentation a user reads: a short README, docs that stay inside the repository, links
that resolve, and results tables that are what `bench/results_table.py` renders from the
committed reports (never hand-typed numbers)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from support import REPO_ROOT, load_bench_script

README_MAX_LINES = 260

# Spelled in two pieces so that this file does not name what it looks for.
OUTSIDE_REFERENCES = ("DESIGN" + ".md", "../" + "shared")
# Allowed to name the folder beside the checkout: the test helpers that skip when the project's
# local datasets are missing, and the records of the arguments past training runs were given.
MAY_NAME_OUTSIDE = {"tests/conftest.py", "tests/support.py",
                    "trees/heads/results-medusa.json", "trees/heads/results-hydra.json"}


def repository_files() -> list[str]:
    """Tracked files and new ones git does not ignore, that exist in the working tree."""
    listed = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files", "--cached", "--others",
                             "--exclude-standard"], capture_output=True, text=True, check=False)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: no list of the repository's files")
    return [name for name in listed.stdout.splitlines() if (REPO_ROOT / name).is_file()]


def read_text(path: Path) -> str | None:
    """The file's text, None for a binary file."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def markdown_files() -> list[Path]:
    return ([REPO_ROOT / "README.md"] + sorted((REPO_ROOT / "docs").rglob("*.md"))
            + sorted((REPO_ROOT / "trees").rglob("README.md")))


def test_readme_stays_short():
    lines = (REPO_ROOT / "README.md").read_text().splitlines()
    assert len(lines) < README_MAX_LINES, (
        f"README.md has {len(lines)} lines; move detail to docs/ (the README links it)")


def test_readme_leads_with_setup_tour_and_gpu_and_links_every_doc():
    text = (REPO_ROOT / "README.md").read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings[:3] == ["## Set up", "## A tour", "## Your own model and heads"]
    gpu = text.split("## On a GPU", 1)[1]
    assert gpu.index("entmtp selftest --device cuda") < gpu.index("entmtp latency")
    for doc in sorted((REPO_ROOT / "docs").glob("*.md")):
        assert f"(docs/{doc.name})" in text, f"README.md does not link docs/{doc.name}"
    assert "(docs/results/README.md)" in text and "(trees/README.md)" in text


def test_nothing_in_the_repository_refers_to_a_file_outside_it():
    found = []
    for name in repository_files():
        if name in MAY_NAME_OUTSIDE:
            continue
        text = read_text(REPO_ROOT / name)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            found += [f"{name}:{number}: {ref}" for ref in OUTSIDE_REFERENCES if ref in line]
    assert not found, "\n".join(found)


def test_the_outside_reference_check_finds_one(tmp_path):
    """The check above is not vacuous: a run record it allows does name the folder outside."""
    assert read_text(REPO_ROOT / "trees" / "heads" / "results-hydra.json").count(
        OUTSIDE_REFERENCES[1]) == 1
    binary = tmp_path / "x.bin"
    binary.write_bytes(b"\0" + OUTSIDE_REFERENCES[0].encode())
    assert read_text(binary) is None


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a markdown heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lstrip("#").strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    inside_code, found = False, set()
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            inside_code = not inside_code
        elif not inside_code and line.startswith("#"):
            found.add(slug(line))
    return found


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_every_relative_link_resolves(path):
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # a URL
        file_part, _, anchor = target.partition("#")
        resolved = (path.parent / file_part).resolve() if file_part else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{path.relative_to(REPO_ROOT)}: " + "; ".join(broken)


def test_slug_follows_github():
    assert slug("## Where the implementation differs from the original design, and why") == (
        "where-the-implementation-differs-from-the-original-design-and-why")
    assert slug("### Draft length by batch size (vLLM, TensorRT-LLM)") == (
        "draft-length-by-batch-size-vllm-tensorrt-llm")
    assert slug("## Trees per batch size (entmtp's own runtime)") == (
        "trees-per-batch-size-entmtps-own-runtime")


def test_trees_readmes_name_every_file_they_describe():
    trees = REPO_ROOT / "trees"
    top = (trees / "README.md").read_text()
    for entry in sorted(trees.iterdir()):
        if entry.name in {"README.md", "__init__.py", "__pycache__"}:
            continue
        assert f"`{entry.name}" in top, f"trees/README.md does not name {entry.name}"
    for heads in sorted(p for p in (trees / "heads").iterdir() if p.is_dir()):
        assert f"`heads/{heads.name}/`" in top  # the code heads as well as the defaults
    assert "`profiles/TASK-TYPE/`" in top
    for folder in ("heads", "latency"):
        text = (trees / folder / "README.md").read_text()
        for entry in sorted((trees / folder).iterdir()):
            if entry.name != "README.md":
                assert f"`{entry.name}" in text, f"trees/{folder}/README.md: {entry.name}"
    for readme in (trees / "heads", trees / "bundles", trees / "profiles", trees / "latency"):
        text = (readme / "README.md").read_text()
        assert "```\nentmtp " in text or "```\n.venv/bin/python bench/" in text, (
            f"{readme.name}/README.md shows no command that made its files")


# -- results tables ---------------------------------------------------------------------------

def results_table():
    return load_bench_script("results_table")


def test_every_results_table_is_rendered_from_its_reports():
    table = results_table()
    files = [REPO_ROOT / "README.md"] + sorted((REPO_ROOT / "docs" / "results").glob("*.md"))
    blocks = 0
    for path in files:
        text = path.read_text()
        blocks += len(table.BLOCK.findall(text))
        try:
            rendered = table.render_blocks(text)
        except FileNotFoundError as err:  # a shallow clone lacks the replaced reports
            pytest.skip(str(err))
        assert rendered == text, (f"{path.relative_to(REPO_ROOT)}: a results table differs from "
                                  "its reports; run bench/results_table.py --update on it")
    assert blocks >= 13  # the README's summary, the 4 current and 8 earlier bench tables


def test_readme_summary_is_the_short_table_of_the_current_reports():
    table = results_table()
    text = (REPO_ROOT / "README.md").read_text()
    (style, sources), = table.BLOCK.findall(text)
    assert style == " summary"
    assert all(":" not in source for source in sources.split())  # current, not from history
    for source in sources.split():
        assert (REPO_ROOT / source).is_file()


def test_summary_rows_are_the_full_rows_cut_down():
    table = results_table()
    report = table.read_report("bench/results/math-cpu2-xeon.json")
    for full, short in zip(table.table_rows(report), table.summary_rows(report), strict=True):
        cell = dict(zip(table.COLUMNS, full, strict=True))
        own = dict(zip(table.SUMMARY_COLUMNS, short, strict=True))
        assert own["vs mc_sim_7b_63 (same heads)"] == (
            cell["vs Hydra+mc_sim"] if cell["heads"] == "hydra" else cell["vs Medusa+mc_sim"])
        for name in set(table.SUMMARY_COLUMNS) & set(table.COLUMNS):
            assert own[name] == cell[name]
    text = table.summary_markdown([("bench/results/math-cpu2-xeon.json", report)])
    assert report["machine"]["cpu_signature"] in text and report["machine"]["date"] in text


def test_update_rewrites_a_stale_block_and_check_names_it(tmp_path, capsys):
    table = results_table()
    source = "bench/results/code-cpu2-xeon.json"
    stale = f"# notes\n\n<!-- results_table: {source} -->\n| old |\n{table.END}\n\nafter\n"
    page = tmp_path / "page.md"
    page.write_text(stale)
    assert table.main(["--check", str(page)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert page.read_text() == stale  # --check writes nothing
    assert table.main(["--update", str(page)]) == 0
    updated = page.read_text()
    assert updated.startswith("# notes\n\n") and updated.endswith(f"{table.END}\n\nafter\n")
    assert "| old |" not in updated and "| code | medusa |" in updated
    assert table.main(["--check", str(page)]) == 0


def test_a_report_from_history_is_read_from_git():
    table = results_table()
    try:
        old = table.read_report("2997a74:bench/results/code-cpu2-xeon.json")
    except FileNotFoundError as err:
        pytest.skip(str(err))
    assert old["machine"]["date"].startswith("2026-12-04")
    with pytest.raises(FileNotFoundError, match="not in this checkout's git history"):
        table.read_report("0000000:bench/results/code-cpu2-xeon.json")
