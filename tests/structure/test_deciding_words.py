"""Deciding code returns records; the words live in ``tuner/outputs/`` (issue 64).

A module under ``tuning/``, ``analysis/`` or ``stats/`` builds no text other than exception
messages and log records (an f-string, a ``%`` or ``.format`` on a string, or a literal of
three words or more outside a docstring; an f-string without a space is a key, a path or a
number's format), and reads no sentence (``"energy" in note``: a
string tested for a word it holds).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "tuner"
DECIDING = ("tuning", "analysis", "stats")
LOGGING = {"debug", "info", "warning", "error", "exception", "critical", "log"}

def _docstrings(tree: ast.AST) -> set[int]:
    """The string statements: docstrings of modules, classes and functions, and the ones
    under an attribute."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and _text(node.value)}


def _text(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def _exempt(tree: ast.AST) -> set[int]:
    """Nodes inside an exception raised, an assertion's message, a log record, a type (an
    annotation, a subscript), a comparison with ``==`` or ``!=`` (a code read), or a ``__repr__``."""
    roots: list[ast.AST] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript):
            roots.append(node.slice)
        elif isinstance(node, ast.Compare) and all(isinstance(op, (ast.Eq, ast.NotEq)) for op in node.ops):
            roots.append(node)
        elif isinstance(node, ast.Raise) and node.exc is not None:
            roots.append(node.exc)
        elif isinstance(node, ast.Assert) and node.msg is not None:
            roots.append(node.msg)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in LOGGING:
            roots.append(node)
        elif isinstance(node, (ast.AnnAssign, ast.arg)) and node.annotation is not None:
            roots.append(node.annotation)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.returns is not None:
                roots.append(node.returns)
            if node.name == "__repr__":
                roots.append(node)
    return {id(n) for root in roots for n in ast.walk(root)}


def places(source: str) -> list[tuple[int, str]]:
    """Where ``source`` builds text or reads a sentence: (line, what)."""
    tree = ast.parse(source)
    skip = _docstrings(tree) | _exempt(tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.JoinedStr):
            skip |= {id(n) for n in ast.walk(node)}
            if any(isinstance(v, ast.Constant) and " " in str(v.value) for v in node.values):
                found.append((node.lineno, "f-string"))  # without a space: a key, a path, a number's format
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod) and _text(node.left):
            found.append((node.lineno, "% format"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format" \
                and isinstance(node.func.value, ast.Constant):
            found.append((node.lineno, ".format"))
        elif _text(node) and len(node.value.split()) >= 3:
            found.append((node.lineno, f"words {node.value[:40]!r}"))
        elif isinstance(node, ast.Compare) and _text(node.left) \
                and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) \
                and not all(isinstance(c, (ast.Tuple, ast.List, ast.Set, ast.Dict)) for c in node.comparators):
            found.append((node.lineno, f"reads {node.left.value!r} in a string"))
    return sorted(found)


def _modules() -> dict[str, Path]:
    return {str(p.relative_to(PACKAGE.parent)): p for d in DECIDING for p in sorted((PACKAGE / d).rglob("*.py"))}


@pytest.mark.parametrize("name", sorted(_modules()))
def test_deciding_code_returns_records_and_the_words_live_in_outputs(name: str) -> None:
    found = places(_modules()[name].read_text(encoding="utf-8"))
    assert not found, (f"{name} builds or reads text in {len(found)} place(s): return a record and word it in "
                       "tuner/outputs/", found)


def test_the_checker_sees_what_it_forbids() -> None:
    built = places('x = f"{a} slower"\ny = "%d runs" % n\nz = "{} x".format(1)\nw = "three words here"\n'
                   'v = "energy" in note\n')
    assert [what.split()[0] for _, what in built] == ["f-string", "%", ".format", "words", "reads"]
    allowed = places('"""A docstring of many words."""\nraise ValueError(f"bad {x}: say what to do")\n'
                     'log.info("a record of %d words", n)\nok = code in ("kept", "dropped")\n'
                     'def f(a: "int | None") -> "str | None":\n    """Its words."""\n'
                     'key = ",".join(f"{k}={v}" for k, v in p)\nT = Callable[[str], "float | str"]\n')
    assert allowed == [], allowed
