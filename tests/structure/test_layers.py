"""The package's shape, checked statically (AST; nothing imported): imports go one way
(docs/architecture.md), no cycles, small modules and functions, few top-level modules."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tuner"
LAYERS = {"stats": -1, "inputs": 0, "harness": 1, "trial": 2, "scriptmode": 3, "analysis": 3, "runner": 4, "study": 4,
          "memory": 5, "tuning": 6, "measurement": 6, "outputs": 7, "api": 8, "cli": 8, "integrations": 8}
"""A module imports from layers below its own, or from its own subpackage (api and cli
share one; ``measurement``, one configuration measured with repeats, sits beside the API
and below the outputs that draw it). Anything else under ``tuner/`` is a command shim or
the package face (9)."""


def _modules() -> dict[str, Path]:
    return {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"): p
            for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every tuner module ``name`` imports: top level, in functions, under TYPE_CHECKING."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base]).strip(".")
            out |= {f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names}
    return {m for m in out if m in known and m != name}


def _layer(module: str) -> tuple[int, str]:
    part = module.split(".")[1] if "." in module else ""
    return LAYERS.get(part, 9), "face" if part in ("api", "cli") else part


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def test_imports_go_one_way() -> None:
    wrong = [f"{a} imports {b}" for a, deps in _graph().items() for b in deps
             if _layer(b)[0] > _layer(a)[0] or (_layer(b)[0] == _layer(a)[0] and _layer(b)[1] != _layer(a)[1])]
    assert not wrong, "\n".join(sorted(wrong))


def test_no_function_is_named_by_a_string() -> None:
    """A ``"tuner.x:function"`` string resolved at run time hides an import from the two tests
    above (the lever registry once named 20 functions of the trial layer, two floors up, so):
    a function is referenced, or called where its layer may call it."""
    import re

    reference = re.compile(r"^(tuner|\{\})(\.\w+)*:\w+$")  # an f-string's {parts} read as "{}"

    def text(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(str(v.value) if isinstance(v, ast.Constant) else "{}" for v in node.values)
        return None

    found = [f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {text(node)}"
             for path in PACKAGE.rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
             if reference.match(text(node) or "")]
    assert not found, "\n".join(found)


def test_no_import_cycles() -> None:
    graph, done, cycles = _graph(), set(), []

    def visit(node: str, stack: list[str]) -> None:
        if node in stack:
            cycles.append(" -> ".join(stack[stack.index(node):] + [node]))
            return
        if node in done:
            return
        for dep in sorted(graph[node]):
            visit(dep, stack + [node])
        done.add(node)

    for name in sorted(graph):
        visit(name, [])
    assert not cycles, "\n".join(cycles)


def test_small_modules_and_functions_few_top_level_modules() -> None:
    modules = _modules()
    long_modules = [f"{n}: {len(p.read_text().splitlines())} lines" for n, p in modules.items()
                    if len(p.read_text().splitlines()) > 400]
    long_functions = [f"{n}.{f.name}: {f.end_lineno - f.lineno + 1} lines" for n, p in modules.items()
                      for f in ast.walk(ast.parse(p.read_text()))
                      if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.end_lineno - f.lineno >= 80]
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    packages = [p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()]
    assert not long_modules and not long_functions, long_modules + long_functions
    assert len(top) <= 12 and len(packages) >= 6, (top, packages)


def test_no_private_member_of_another_object_without_a_reason() -> None:
    """``x._name`` only on ``self``/``cls``/``super()``, or with ``# noqa: SLF001`` and why on the line
    (a private of Optuna's only in ``tuner/study/backend.py``)."""
    found = []
    for name, path in _modules().items():
        lines = path.read_text().splitlines()
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if (isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                    and node.value.func.id == "super"):
                continue  # a subclass extending its own base's method (ruff's SLF001 agrees)
            if isinstance(node.value, ast.Name) and node.value.id == "os" and node.attr == "_exit":
                continue  # documented: exit without cleanup
            line = lines[node.end_lineno - 1]
            if "noqa: SLF001" not in line or ("optuna" in line.lower() and name != "tuner.study.backend"):
                found.append(f"{name}:{node.lineno}: .{node.attr}")
    assert not found, "\n".join(found)


def test_optuna_is_imported_only_behind_the_study_interface() -> None:
    """The search talks to the tuner's own study (``tuner/study/study.py``: ask, tell,
    enqueue, records) and reads :class:`tuner.study.trial_record.Record`; Optuna is imported by
    three modules of ``tuner/study`` at most (issue 35: it was 17, in tuning/, outputs/ and
    memory/), in functions and under TYPE_CHECKING counted too."""
    importers = set()
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(n == "optuna" or n.startswith("optuna.") for n in names):
                importers.add(name)
    assert importers <= {"tuner.study.study", "tuner.study.backend", "tuner.study.storage"}, sorted(importers)


def test_no_subpackage_over_2000_lines_without_subpackages() -> None:
    """A large subpackage is split by what its parts do (tuning/ once held 3,200 lines: the
    search, the study and the memory model)."""
    big = []
    for package in (p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()):
        lines = sum(len(f.read_text().splitlines()) for f in package.glob("*.py"))
        nested = [d for d in package.iterdir() if (d / "__init__.py").is_file()]
        if lines > 2000 and not nested:
            big.append(f"{package.name}: {lines} lines in one level")
    assert not big, big
