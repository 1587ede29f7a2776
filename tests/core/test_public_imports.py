"""Packages use each other's public names: no library package or bench script imports another
package's private ``_module`` (a module's own package may)."""

import ast
from pathlib import Path

import entmtp.runtime

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "treesearch", "model", "runtime", "evaluation", "calibrate", "cli")

# Bench scripts that reach into internals on purpose: ShareGPT filtering helpers of the task
# loader, the trainer's example builders and batch loss, and the live commands' helpers (CLI,
# not library).
BENCH_PRIVATE = {
    ("train_heads.py", "entmtp.calibrate._tasks"),
    ("signal_auc.py", "entmtp.calibrate._head_examples"),
    ("prefix_attention_probe.py", "entmtp.calibrate._head_examples"),
    ("prefix_attention_probe.py", "entmtp.calibrate._train"),
    ("bench_latency_fidelity.py", "entmtp.cli._live"),
    ("bench_low_precision.py", "entmtp.cli._live"),
    ("bench_cpu_dtypes.py", "entmtp.cli._live"),
}


def private_imports(path: Path, own: str | None) -> list[str]:
    """Modules ``entmtp.<package>._<module>`` of another package that ``path`` imports from."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level == 0 and (node.module or "").startswith("entmtp."):
                parts = node.module.split(".")[1:]
            elif node.level == 2 and own is not None:
                parts = (node.module or "").split(".")
            else:
                continue
            names = [".".join(parts)]
        elif isinstance(node, ast.Import):
            names = [alias.name.removeprefix("entmtp.") for alias in node.names
                     if alias.name.startswith("entmtp.")]
        else:
            continue
        for name in names:
            package, _, module = name.partition(".")
            if package in PACKAGES and package != own and module.startswith("_"):
                found.append(f"entmtp.{name}")
    return found


def test_library_packages_import_only_public_names():
    offending = [f"{package}/{path.name}: {module}"
                 for package in PACKAGES
                 for path in sorted((ROOT / package).glob("*.py"))
                 for module in private_imports(path, package)]
    assert offending == []


def test_bench_scripts_import_only_public_names_but_the_listed_internals():
    found = {(path.name, module)
             for path in sorted((ROOT / "bench").glob("*.py"))
             for module in private_imports(path, None)}
    assert found <= BENCH_PRIVATE


def test_private_imports_are_seen(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text("from entmtp.runtime._decode import X\nfrom ..treesearch._tree import Tree\n"
                    "import entmtp.model._stats\nfrom ._own import y\n"
                    "from entmtp.core import Z\nfrom entmtp.cli._live import w\n")
    assert private_imports(path, "cli") == [
        "entmtp.runtime._decode", "entmtp.treesearch._tree", "entmtp.model._stats"]


def test_every_runtime_export_resolves():
    for name in entmtp.runtime.__all__:
        assert getattr(entmtp.runtime, name) is not None, name
