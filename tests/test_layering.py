"""The package's layers, read from the source: what each package of met may import, and the policy package's purity.

met.speculative (the policy) is pure Python: no torch, no I/O, no clock (DESIGN). met.model holds
the model and knows nothing of the engine that runs it; met.engine runs the model and the policy;
met.serve and met.bench sit on top. Imports inside functions count: a lazy import is still a
dependency.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parents[1] / "met"

# what each package's modules may import of met (itself always); met/cli.py and met's top modules are free.
# met.exit_codes and met.path_option (the exit statuses; the parser of options naming files) import nothing of met
ALLOWED = {
    "speculative": set(),
    "model": {"met.exit_codes", "met.path_option"},
    "engine": {"met.exit_codes", "met.path_option", "met.model", "met.speculative"},
}
# modules the policy may not import: torch and numpy, the file system, processes, sockets, clocks, randomness
IMPURE = {"torch", "numpy", "os", "io", "pathlib", "shutil", "tempfile", "sys", "socket", "subprocess",
          "threading", "asyncio", "time", "random", "logging", "pynvml", "safetensors", "httpx"}
IMPURE_CALLS = {"open", "print", "input"}


def imports(path: Path, root: Path = PACKAGE.parent) -> set[str]:
    """Every module an import statement of the file names, at any depth (relative ones resolved from root)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from . import x: the file's own package
                base = ".".join(path.relative_to(root).with_suffix("").parts[: -node.level])
                found.add(f"{base}.{node.module}" if node.module else base)
            elif node.module:
                found.add(node.module)
    return found


def modules(package: str) -> list[Path]:
    return sorted((PACKAGE / package).rglob("*.py"))


def test_every_layer_has_modules():
    # a renamed package would leave its rules checking nothing
    for package in ALLOWED:
        assert len(modules(package)) >= 5, package


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_the_layers_below_it(package):
    allowed = ALLOWED[package] | {f"met.{package}"}
    wrong = sorted(f"{path.relative_to(PACKAGE.parent)}: {name}" for path in modules(package)
                   for name in imports(path)
                   if (name == "met" or name.startswith("met.")) and not any(
                       name == a or name.startswith(a + ".") for a in allowed))
    assert not wrong, f"met.{package} may import only {sorted(allowed)}; found:\n" + "\n".join(wrong)


def test_the_policy_package_is_pure():
    wrong = []
    for path in modules("speculative"):
        where = path.relative_to(PACKAGE.parent)
        wrong += [f"{where}: imports {name}" for name in imports(path) if name.split(".")[0] in IMPURE]
        wrong += [f"{where}:{node.lineno}: calls {node.func.id}()" for node in ast.walk(ast.parse(path.read_text()))
                  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in IMPURE_CALLS]
    assert not wrong, "met.speculative must stay free of torch, I/O and clocks:\n" + "\n".join(wrong)


def test_imports_sees_a_lazy_import_and_resolves_a_relative_one(tmp_path):
    # the checker itself: an import inside a function counts, and "from .x import" is met.<package>.x
    path = tmp_path / "met" / "model" / "probe.py"
    path.parent.mkdir(parents=True)
    path.write_text("def f():\n    from met.engine import runner\n    import torch.nn\n"
                    "from .transformer import Transformer\nfrom . import corpus\n")
    assert imports(path, tmp_path) == {"met.engine", "torch.nn", "met.model.transformer", "met.model"}
