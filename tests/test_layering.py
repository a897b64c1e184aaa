"""The package's layers, read from the source: one declared order every package of met keeps, no import cycle
anywhere, and the policy package's purity.

met.speculative (the policy) is pure Python: no torch, no I/O, no clock (DESIGN). met.model holds
the model and knows nothing of the engine that runs it; met.engine runs the model and the policy;
met.bench, met.serve and met.train sit on it (met.serve reads tables through met.bench's table
files, never the reverse); met/cli.py wires them all. Imports inside functions count: a lazy
import is still a dependency, and a cycle hidden in a function is still a cycle.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "met"

# The order, lowest first: a layer may import itself and the layers before it. "base" is met's top modules
# (met/__init__.py, exit_codes.py, path_option.py, ...): below every package but speculative, which imports
# nothing of met. "cli" is met/cli.py, which wires every sub-app.
ORDER = ("speculative", "model", "engine", ("bench", "serve", "train"), "cli")
BASE = "base"
# the one import across a layer: a serve reads its tables through bench's table files (bench never imports serve)
ACROSS = {"serve": {"met.bench.measured_boot", "met.bench.table_files", "met.bench.table_warnings",
                    "met.bench.tables_cli"}}
# modules the policy may not import: torch and numpy, the file system, processes, sockets, clocks, randomness
IMPURE = {"torch", "numpy", "os", "io", "pathlib", "shutil", "tempfile", "sys", "socket", "subprocess",
          "threading", "asyncio", "time", "random", "logging", "pynvml", "safetensors", "httpx"}
IMPURE_CALLS = {"open", "print", "input"}


def layers() -> list[tuple[str, ...]]:
    """ORDER as tuples of packages, lowest first."""
    return [layer if isinstance(layer, tuple) else (layer,) for layer in ORDER]


def allowed(package: str) -> set[str]:
    """The packages `package`'s modules may import (itself included)."""
    if package == "speculative":
        return {"speculative"}
    if package == BASE:
        return {BASE}
    below = {BASE}
    for layer in layers():
        if package in layer:
            return below | {package}
        below |= set(layer)
    raise KeyError(f"met.{package} is in no layer of ORDER; declare where it sits")


def package_of(module: str, root: Path = PACKAGE.parent) -> str:
    """The layer name of a module of met: its subpackage, "cli" for met.cli, "base" for met's other top modules."""
    parts = module.split(".")
    if len(parts) > 1 and (root / "met" / parts[1]).is_dir():
        return parts[1]
    return "cli" if module == "met.cli" else BASE


def module_name(path: Path, root: Path = PACKAGE.parent) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path = PACKAGE.parent) -> set[str]:
    """Every module an import statement of the file names, at any depth (relative ones resolved from root).

    `from package import name` names package.name where that is a module of its own (a submodule),
    else the package.
    """
    found = set()
    own = module_name(path, root).split(".")
    if path.name != "__init__.py":
        own = own[:-1]  # the package a relative import starts from
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from . import x: the file's own package
                base = ".".join(own[: len(own) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if _is_module(sub, root) else module)
    return found


def _is_module(name: str, root: Path) -> bool:
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def graph(root: Path = PACKAGE.parent) -> dict[str, set[str]]:
    """Each module of met and the modules of met it imports (the nearest module an import names)."""
    modules = {module_name(p, root): p for p in sorted((root / "met").rglob("*.py"))}
    edges = {}
    for name, path in modules.items():
        targets = set()
        for imported in imports(path, root):
            while imported and imported not in modules:  # met.x.y.Name -> met.x.y
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        edges[name] = targets
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import graph's strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def modules(package: str) -> list[Path]:
    if package == "cli":
        return [PACKAGE / "cli.py"]
    if package == BASE:
        return sorted(p for p in PACKAGE.glob("*.py") if p.name != "cli.py")
    return sorted((PACKAGE / package).rglob("*.py"))


PACKAGES = [p for layer in layers() for p in layer] + [BASE]


def test_every_package_is_in_the_order():
    # a package nobody declared would be checked against nothing; a declared one that is gone checks nothing
    on_disk = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    declared = {p for p in PACKAGES if p not in ("cli", BASE)}
    assert on_disk == declared, f"packages on disk {sorted(on_disk)}, declared in ORDER {sorted(declared)}"
    for package in PACKAGES:
        assert modules(package), package


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_imports_only_the_layers_below_it(package):
    may = allowed(package)
    wrong = sorted(f"{path.relative_to(PACKAGE.parent)}: {name}" for path in modules(package)
                   for name in imports(path)
                   if (name == "met" or name.startswith("met."))
                   and package_of(name) not in may and name not in ACROSS.get(package, ()))
    assert not wrong, (f"met.{package} may import only {sorted(may)} (and {sorted(ACROSS.get(package, ()))}); "
                       "found:\n" + "\n".join(wrong))


def test_no_import_cycle_between_or_inside_packages():
    edges = graph()
    found = cycles(edges)
    shown = [" <-> ".join(c) + "\n    " + "\n    ".join(f"{a} -> {b}" for a in c for b in sorted(edges[a]) if b in c)
             for c in found]
    assert not found, "import cycles (imports inside functions count):\n" + "\n".join(shown)


def test_the_policy_package_is_pure():
    wrong = []
    for path in modules("speculative"):
        where = path.relative_to(PACKAGE.parent)
        wrong += [f"{where}: imports {name}" for name in imports(path) if name.split(".")[0] in IMPURE]
        wrong += [f"{where}:{node.lineno}: calls {node.func.id}()" for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in IMPURE_CALLS]
    assert not wrong, "met.speculative must stay free of torch, I/O and clocks:\n" + "\n".join(wrong)


def test_imports_sees_a_lazy_import_and_resolves_a_relative_one(tmp_path):
    # the checker itself: an import inside a function counts, "from .x import" is met.<package>.x, and
    # "from package import submodule" names the submodule
    path = tmp_path / "met" / "model" / "probe.py"
    path.parent.mkdir(parents=True)
    (tmp_path / "met" / "model" / "corpus.py").write_text("")
    path.write_text("def f():\n    from met.engine import runner\n    import torch.nn\n"
                    "from .transformer import Transformer\nfrom . import corpus\n")
    assert imports(path, tmp_path) == {"met.engine", "torch.nn", "met.model.transformer", "met.model.corpus"}


def test_cycles_finds_one_hidden_in_a_function_and_none_in_a_chain(tmp_path):
    # the checker itself: a -> b at the top and b -> a inside a function is a cycle; a -> b -> c is none
    pkg = tmp_path / "met" / "engine"
    pkg.mkdir(parents=True)
    for name in ("__init__", "c"):
        (pkg / f"{name}.py").write_text("")
    (tmp_path / "met" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from met.engine import b\n")
    (pkg / "b.py").write_text("import met.engine.c\n\ndef f():\n    from met.engine.a import g\n")
    assert cycles(graph(tmp_path)) == [["met.engine.a", "met.engine.b"]]
    (pkg / "b.py").write_text("import met.engine.c\n")
    assert cycles(graph(tmp_path)) == []


def test_the_order_keeps_bench_below_serve_and_the_policy_below_all():
    # the declared rules themselves: serve may read bench's table files, bench never imports serve
    assert "serve" not in allowed("bench") and "bench" not in allowed("serve")
    assert allowed("speculative") == {"speculative"} and "speculative" in allowed("model")
    assert {"bench", "serve", "train", "engine"} <= allowed("cli")
