"""Every code the deciding code emits has its sentence, and every sentence has a code that
is emitted (issue 64: the rendered text is checked only for templates missing or unused).

Read from the source (AST): the codes are the string constants the deciding code puts in a
record (a ``Said``'s code, a decision's ``reason``, a ``needed`` or ``held`` record's
``code``, a warning's code, why a question was left open), the templates are the keys of
the tables in ``tuner/outputs/``.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

from tuner.outputs import closing, diagnosis, wording
from tuner.tuning import summary

PACKAGE = Path(__file__).resolve().parents[2] / "tuner"


def _tree(module: str) -> ast.AST:
    return ast.parse((PACKAGE / module).read_text(encoding="utf-8"))


def _strings(node: ast.AST | None) -> Iterator[str]:
    """The string constants ``node`` can be: a constant, or either branch of a conditional."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        yield node.value
    elif isinstance(node, ast.IfExp):
        yield from _strings(node.body)
        yield from _strings(node.orelse)


def _calls(tree: ast.AST, name: str) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == name:
            yield node


def _function(tree: ast.AST, name: str) -> ast.AST:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def _values(tree: ast.AST, key: str) -> set[str]:
    """The strings ``tree`` puts at ``key``: in a dict literal (``{"reason": "cheap"}``) or by
    assignment (``entry["reason"] = "gain"``, ``entry["label"], entry["reason"] = x, "gain"``)."""
    pairs: list[tuple[ast.AST | None, ast.AST | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            pairs += zip(node.keys, node.values)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                targets, values = ((target.elts, node.value.elts) if isinstance(target, ast.Tuple)
                                   and isinstance(node.value, ast.Tuple) else ([target], [node.value]))
                pairs += [(t.slice, v) for t, v in zip(targets, values) if isinstance(t, ast.Subscript)]
    return {s for k, v in pairs if isinstance(k, ast.Constant) and k.value == key for s in _strings(v)}


def _first_arguments(name: str) -> set[str]:
    """The codes given to ``name(...)`` anywhere in the package."""
    return {s for path in PACKAGE.rglob("*.py") for call in _calls(ast.parse(path.read_text(encoding="utf-8")), name)
            if call.args for s in _strings(call.args[0])}


def test_every_said_code_has_its_sentence_and_every_sentence_is_said():
    assert _first_arguments("Said") == set(wording.SAID)


def test_every_reason_of_a_change_has_its_verdict_and_every_verdict_a_reason():
    recommend = _tree("tuning/recommend.py")
    finish = _tree("tuning/finish.py")
    emitted = _values(recommend, "reason") | (_values(finish, "reason") - {"faster"})  # a move's own, below
    assert emitted == set(wording.CHANGE)
    assert set(summary.REASONS) == emitted | {"unrecorded"}  # a run folder's from before: its own words


def test_every_move_of_the_finish_has_its_sentence():
    finish = _tree("tuning/finish.py")
    moved = {s for call in _calls(finish, "_moved") for arg in call.args if isinstance(arg, ast.Dict)
             for k, v in zip(arg.keys, arg.values) if isinstance(k, ast.Constant) and k.value == "reason"
             for s in _strings(v)}
    assert moved == set(wording.MOVE)


def test_why_a_change_is_needed_or_held_has_its_words():
    recommend = _tree("tuning/recommend.py")
    assert _values(_function(recommend, "ruled_out"), "code") == set(wording.NEEDED)
    assert _values(_function(recommend, "_held"), "code") == set(wording.HELD)


def test_every_warning_has_its_words_and_every_word_a_warning():
    emitted = {s for call in _calls(_tree("tuning/summary.py"), "Warning") if call.args for s in _strings(call.args[0])}
    assert emitted == set(summary.WARNINGS) == set(closing.WARNINGS)


def test_why_a_question_was_left_open_has_its_words():
    finish = _tree("tuning/finish.py")
    why = {s for node in ast.walk(finish) if isinstance(node, ast.Assign)
           and any(getattr(t, "id", None) == "why" for t in node.targets) for s in _strings(node.value)}
    assert why == set(wording.LEFT_OPEN)


def test_every_verdict_and_step_of_the_diagnosis_has_its_words():
    """A verdict's code is its third argument (or ``code=`` where the evidence replaces one); a
    step's is its first, or what ``_buckets`` returns; ``recorded`` is an older folder's words."""
    trees = [_tree(m) for m in ("analysis/diagnose.py", "analysis/evidence.py", "analysis/remedies.py")]
    verdicts = {s for t in trees for call in _calls(t, "Verdict") if len(call.args) > 2 for s in _strings(call.args[2])}
    verdicts |= {s for t in trees for call in _calls(t, "replace") for k in call.keywords if k.arg == "code"
                 for s in _strings(k.value)}
    assert verdicts | {"recorded"} == set(diagnosis.EVIDENCE)
    steps = {s for t in trees for call in _calls(t, "Step") if call.args for s in _strings(call.args[0])}
    buckets = _function(trees[0], "_buckets")
    steps |= {s for node in ast.walk(buckets) if isinstance(node, ast.Return) for s in _strings(node.value)} - {""}
    assert steps == set(diagnosis.STEPS) | {"unrouted"}
    assert set(diagnosis.NEXT) <= verdicts
