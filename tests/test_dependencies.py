"""One-way dependencies between sparserl's packages, read from the source with ``ast``.

- nothing imports ``sparserl.cli`` (the command line sits on top of everything);
- ``sparserl.train`` may use ``sparserl.eval``, never the reverse;
- ``sparserl.cluster`` (the rollout workers) sits under ``sparserl.train``, which alone starts it;
- ``sparserl.data.arith`` and ``sparserl.data.loaders`` do not import each other both ways (the
  loaders build the arithmetic task; both share ``sparserl.data.example``).
"""
import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "sparserl"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> set[str]:
    """Absolute names of every module an import statement of ``path`` names (lazy ones included)."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # `from . import cli`
    return found


def refers_to(names: set[str], package: str) -> set[str]:
    return {n for n in names if n == package or n.startswith(package + ".")}


def files(sub: str = "") -> list[Path]:
    return sorted((SRC / sub).rglob("*.py"))


def test_the_import_walker_sees_relative_and_lazy_imports():
    names = imports_of(SRC / "eval" / "evaluate.py")
    assert "sparserl.rollout.engine" in names and "sparserl.data.options" in names
    assert "sparserl.train.trainer" in imports_of(SRC / "cli.py")  # a lazy import inside a function


@pytest.mark.parametrize("path", files(), ids=lambda p: module_name(p))
def test_nothing_imports_cli(path):
    if path.name == "cli.py" and path.parent == SRC:
        return
    assert not refers_to(imports_of(path), "sparserl.cli")


def test_eval_never_imports_train_or_cli():
    for path in files("eval"):
        bad = refers_to(imports_of(path), "sparserl.train") | refers_to(imports_of(path), "sparserl.cli")
        assert not bad, f"{module_name(path)} imports {sorted(bad)}"


def test_train_never_imports_cli():
    for path in files("train"):
        assert not refers_to(imports_of(path), "sparserl.cli"), module_name(path)


def test_data_arith_and_loaders_one_way():
    arith, loaders = imports_of(SRC / "data" / "arith.py"), imports_of(SRC / "data" / "loaders.py")
    assert not refers_to(arith, "sparserl.data.loaders")
    assert "sparserl.data.example" in arith and "sparserl.data.example" in loaders


def test_rollout_kv_is_the_one_builder():
    """cli, train, eval and bench build compressors through sparserl.rollout.kv's builder only."""
    for rel in ("cli.py", "train/trainer.py", "eval/evaluate.py", "bench/rollout.py"):
        text = (SRC / rel).read_text()
        assert "def build_compressor" not in text and "def compressor_from_args" not in text, rel


@pytest.mark.parametrize("station", ["rollout", "reward", "score", "correct", "data", "models"])
def test_stations_never_import_train_eval_or_cli(station):
    """The stations a step strings together depend on no one above them (the batch record they
    share is ``sparserl.batch``, outside every station)."""
    for path in files(station):
        names = imports_of(path)
        bad = refers_to(names, "sparserl.train") | refers_to(names, "sparserl.eval") | refers_to(names, "sparserl.cli")
        assert not bad, f"{module_name(path)} imports {sorted(bad)}"


def test_cluster_sits_under_train():
    """train -> cluster -> rollout / models: the rollout workers never reach up into the training loop,
    and only the trainer starts them."""
    for path in files("cluster"):
        bad = {n for pkg in ("sparserl.train", "sparserl.compare", "sparserl.cli") for n in refers_to(imports_of(path), pkg)}
        assert not bad, f"{module_name(path)} imports {sorted(bad)}"
    users = {module_name(p) for p in files() if refers_to(imports_of(p), "sparserl.cluster")
             and not module_name(p).startswith("sparserl.cluster")}
    assert users and all(u.startswith("sparserl.train.") for u in users), users
