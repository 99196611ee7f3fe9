"""One-way dependencies between sparserl's modules and packages, read from the source with ``ast``.

Every import statement counts, lazy ones inside functions included: an import hidden in a function is
still a dependency. Two graphs are checked for cycles, each failing with every cycle it finds:

- modules: ``sparserl.rollout.engine`` -> ``sparserl.rollout.cache`` and so on (``from . import x``
  counts as an import of the module ``x``, not of the package's ``__init__``);
- top-level packages: ``sparserl.X`` for every ``sparserl/X/`` folder and ``sparserl/X.py`` file, an edge
  for every module of one importing a module of another.

The packages in their order, each importing only packages before it (:data:`PACKAGE_ORDER`):

    errors, envpath, json_cache, registry, runlog, batch, packing,
    models, rollout, checks, cost, score, correct, advantages, reward, data,
    config, memory, preflight, mismatch, eval, cluster, train,
    bench, calibrate, compare, commands, cli

The stations a step strings together come first (the sampler, the scoring, the corrections, the rewards,
the data), then the configuration that names them, the measurements of the mismatch that read a config,
the evaluation, the workers and the training loop, the benchmarks and studies built on the loop, and the
command line on top. ``models`` < ``rollout``: the machine's description
(:mod:`sparserl.models.machine`) sits in models, and the sampler's ``dtype: auto`` times the engine class
the engine hands it (:mod:`sparserl.rollout.dtype_choice`).

Further rules:

- nothing imports ``sparserl.cli`` or ``sparserl.commands`` (the command line sits on top of everything);
- ``sparserl.train`` may use ``sparserl.eval``, never the reverse;
- ``sparserl.cluster`` (the rollout workers) sits under ``sparserl.train``, which alone starts it;
- ``sparserl.data.arith`` and ``sparserl.data.loaders`` do not import each other both ways (the
  loaders build the arithmetic task; both share ``sparserl.data.example``).
"""

import ast
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "sparserl"

#: the top-level packages, lowest first: each imports only packages before it (the module docstring)
PACKAGE_ORDER = (
    "errors",
    "envpath",
    "json_cache",
    "registry",
    "runlog",
    "batch",
    "packing",
    "models",
    "rollout",
    "checks",
    "cost",
    "score",
    "correct",
    "advantages",
    "reward",
    "data",
    "config",
    "memory",
    "preflight",
    "mismatch",
    "eval",
    "cluster",
    "train",
    "bench",
    "calibrate",
    "compare",
    "commands",
    "cli",
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def files(sub: str = "") -> list[Path]:
    return sorted((SRC / sub).rglob("*.py"))


@cache
def modules() -> frozenset[str]:
    """Every module of the source tree, packages (their ``__init__``) included."""
    return frozenset(module_name(p) for p in files())


def _imported(path: Path):
    """(target, names) of every import statement of ``path``, targets absolute: ``import a.b`` gives
    (``a.b``, ()), ``from ..x import y, z`` gives (``sparserl.x``, (``y``, ``z``))."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            yield target, tuple(a.name for a in node.names)


def imports_of(path: Path) -> set[str]:
    """Absolute names of every module an import statement of ``path`` names (lazy ones included), and
    of every name a ``from`` import takes (``from . import cli`` gives ``sparserl.cli``)."""
    found = set()
    for target, names in _imported(path):
        found.add(target)
        found.update(f"{target}.{n}" for n in names)
    return found


def _nearest_module(name: str) -> str | None:
    while name and name not in modules():
        name = name.rpartition(".")[0]
    return name or None


def module_imports(path: Path) -> set[str]:
    """The sparserl modules ``path`` imports: ``from P import x`` is the module ``P.x`` where there is
    one, else ``P`` itself (a name its ``__init__`` defines)."""
    found = set()
    for target, names in _imported(path):
        if not target.startswith("sparserl"):
            continue
        plain = [n for n in names if f"{target}.{n}" not in modules()]
        found.update(f"{target}.{n}" for n in names if f"{target}.{n}" in modules())
        if plain or not names:
            found.add(_nearest_module(target))
    found.discard(None)
    found.discard(module_name(path))
    return found


def refers_to(names: set[str], package: str) -> set[str]:
    return {n for n in names if n == package or n.startswith(package + ".")}


def package_of(module: str) -> str:
    """``sparserl.X`` for a module of ``sparserl/X/`` or ``sparserl/X.py``."""
    return ".".join(module.split(".")[:2])


@cache
def module_graph() -> dict[str, frozenset[str]]:
    return {module_name(p): frozenset(module_imports(p)) for p in files() if p.parent != SRC or p.name != "__init__.py"}


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for mod, targets in module_graph().items():
        graph.setdefault(package_of(mod), set()).update(
            package_of(t) for t in targets if t != "sparserl" and package_of(t) != package_of(mod)
        )
    return graph


def strongly_connected(graph: dict) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one node."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def cycles(graph: dict) -> list[list[str]]:
    """For every strongly connected component, each of its nodes' shortest way back to itself (one cycle
    per edge that closes one, without repeats): enough to name every import to cut."""
    found, seen = [], set()
    for comp in strongly_connected(graph):
        members = set(comp)
        for start in comp:
            prev, frontier = {start: None}, [start]
            path = None
            while frontier and path is None:
                nxt = []
                for v in frontier:
                    for w in sorted(graph.get(v, ())):
                        if w == start:
                            path, node = [start], v
                            while node != start:
                                path.insert(1, node)
                                node = prev[node]
                            break
                        if w in members and w not in prev:
                            prev[w] = v
                            nxt.append(w)
                    if path is not None:
                        break
                frontier = nxt
            if path is not None:
                turn = path.index(min(path))
                key = tuple(path[turn:] + path[:turn])
                if key not in seen:
                    seen.add(key)
                    found.append(list(key))
    return found


def _describe(cycle: list[str]) -> str:
    return " -> ".join([*cycle, cycle[0]])


def test_the_import_walker_sees_relative_and_lazy_imports():
    names = imports_of(SRC / "eval" / "evaluate.py")
    assert "sparserl.rollout.engine" in names and "sparserl.data.options" in names
    assert "sparserl.rollout.engine" in module_imports(SRC / "eval" / "evaluate.py")
    lazy = {m for p in files("commands") for m in module_imports(p)}
    assert "sparserl.train.trainer" in lazy  # `sparserl train`'s import sits inside its run()
    native = module_imports(SRC / "rollout" / "native" / "linear.py")
    assert "sparserl.rollout.native.compiler" in native and "sparserl.rollout.native" not in native


def test_cycles_are_found_and_named():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"f"}, "f": {"e"}}
    assert strongly_connected(graph) == [["a", "b", "c"], ["e", "f"]]
    assert sorted(map(_describe, cycles(graph))) == ["a -> b -> c -> a", "e -> f -> e"]


def test_no_module_imports_another_that_imports_it_back():
    found = cycles(module_graph())
    assert not found, "import cycles between modules:\n" + "\n".join(map(_describe, found))


def test_no_package_imports_another_that_imports_it_back():
    """Top-level packages form no cycle (their order is the module docstring's)."""
    found = cycles(package_graph())
    assert not found, "import cycles between packages:\n" + "\n".join(
        f"{_describe(c)}  ("
        + "; ".join(f"{a} -> {b}: {', '.join(_witnesses(a, b))}" for a, b in zip(c, c[1:] + c[:1]))
        + ")"
        for c in found
    )


def _witnesses(a: str, b: str) -> list[str]:
    """The modules of package ``a`` that import package ``b`` (what to move)."""
    return sorted(
        f"{m.removeprefix(a + '.')}"
        for m, ts in module_graph().items()
        if package_of(m) == a and any(package_of(t) == b for t in ts)
    )


def test_packages_import_only_packages_before_them():
    """:data:`PACKAGE_ORDER` holds every package, and every import points to an earlier one."""
    rank = {p: i for i, p in enumerate(f"sparserl.{name}" for name in PACKAGE_ORDER)}
    graph = package_graph()
    assert not set(graph) - set(rank), f"packages missing from PACKAGE_ORDER: {sorted(set(graph) - set(rank))}"
    upward = sorted(
        f"{a} -> {b} ({', '.join(_witnesses(a, b))})" for a, bs in graph.items() for b in bs if rank[b] > rank[a]
    )
    assert not upward, "imports of a later package:\n" + "\n".join(upward)


@pytest.mark.parametrize("path", files(), ids=lambda p: module_name(p))
def test_nothing_imports_cli_or_commands(path):
    mod = module_name(path)
    if mod == "sparserl.cli" or mod.startswith("sparserl.commands"):
        return
    names = imports_of(path)
    assert not refers_to(names, "sparserl.cli") | refers_to(names, "sparserl.commands")


def test_commands_import_no_cli():
    for path in files("commands"):
        assert not refers_to(imports_of(path), "sparserl.cli"), module_name(path)


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
    """The commands, train, eval and bench build compressors through sparserl.rollout.kv's builder only."""
    for path in [
        *files("commands"),
        SRC / "train" / "trainer.py",
        SRC / "eval" / "evaluate.py",
        SRC / "bench" / "rollout.py",
    ]:
        text = path.read_text()
        assert "def build_compressor" not in text and "def compressor_from_args" not in text, module_name(path)


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
        bad = {
            n
            for pkg in ("sparserl.train", "sparserl.compare", "sparserl.cli")
            for n in refers_to(imports_of(path), pkg)
        }
        assert not bad, f"{module_name(path)} imports {sorted(bad)}"
    users = {
        module_name(p)
        for p in files()
        if refers_to(imports_of(p), "sparserl.cluster") and not module_name(p).startswith("sparserl.cluster")
    }
    assert users and all(u.startswith("sparserl.train.") for u in users), users
