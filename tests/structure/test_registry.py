"""The lever registry is complete: every lever carries what each layer needs, and each
layer's view of the levers covers them all (a lever a layer silently drops fails here)."""

from __future__ import annotations

import ast
import typing
from pathlib import Path
from typing import Any

import pytest

from tuner.analysis import attribution, diagnose, evidence
from tuner.inputs import levers
from tuner.inputs.errors import RecipeError
from tuner.inputs.lever import ADAPTERS, EXPORT_FILES, Lever
from tuner.inputs.levers import orders
from tuner.inputs.plan import FIELDS, ORDER, SECTION_OF, SECTIONS, Plan
from tuner.inputs.rules import applies, conflict
from tuner.inputs.script import ADAPTER_ROUTES
from tuner.inputs.space import Machine, make_config
from tuner.memory import capacity
from tuner.memory import model as memory
from tuner.outputs import console, exports
from tuner.scriptmode.config import TrialConfig
from tuner.tuning.proposing import guided

LEVERS = levers.LEVERS
TITLE = levers.orders.TITLE
WORLD = 2
ANY = Machine(cuda=True, bf16=True, fp16=True, cudnn=True, capability=(9, 0),
              packages=frozenset({"torchao", "liger_kernel"}))
CONTEXTS = ({}, {"num_workers": 2}, {"zero_stage": 1}, {"zero_stage": 2}, {"fsdp": "full_shard"},
            {"pipeline_parallel": 2}, {"tensor_parallel": 2}, {"compile": True})
"""Where a lever is tried: the first of these in which it applies."""


def _verdict_kinds() -> set[str]:
    """Every verdict kind the analysis can emit, read from its string literals."""
    kinds = set()
    for module in (diagnose, evidence):
        for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Verdict" and node.args \
                    and isinstance(node.args[0], ast.Constant):
                kinds.add(node.args[0].value)
            if isinstance(node, ast.keyword) and node.arg == "kind" and isinstance(node.value, ast.Constant):
                kinds.add(node.value.value)  # replace(verdict, kind=...)
    return kinds


@pytest.mark.parametrize("name", list(LEVERS))
def test_every_lever_is_declared_whole(name: str) -> None:
    lever = LEVERS[name]
    assert lever.help and lever.risk, f"{name}: help and risk are what the recipe docs and attribution say"
    assert lever.label, f"{name}: no label for result rows"
    assert lever.script.adapters <= set(ADAPTERS)
    files = lever.exported.fields
    assert files and set(files) <= set(EXPORT_FILES), f"{name}: reaches no config to paste"
    if lever.applied.stage == "process":
        assert callable(lever.applied.hold), f"{name}: a process lever's setter"
    assert (lever.applied.loader_kwarg is not None) == (lever.applied.stage == "loader" or name == "micro_batch_size")
    if lever.memory.effect == "activations":
        assert set(lever.choices or ()) <= set(lever.memory.prior), f"{name}: an activation prior for every value"
    if lever.kind is not int:
        assert lever.choices or lever.kind is bool, f"{name}: a string lever lists its values"
        assert lever.parse(lever.default, name) == lever.default
    if lever.ordered:
        assert lever.kind is int or lever.choices, f"{name}: ordered along what?"


def test_orders_are_total_and_every_layer_sees_every_lever() -> None:
    assert list(LEVERS) == list(ORDER)
    for order in ("PATH", "WALK"):
        names = getattr(orders, order)
        assert sorted(names) == sorted(LEVERS), f"orders.{order} does not hold every lever once: {names}"
    for kind, names in orders.VERDICTS.items():
        assert len(set(names)) == len(names) and set(names) <= set(LEVERS), (kind, names)
    assert set(orders.VERDICTS) <= _verdict_kinds(), "a verdict the analysis never emits points at levers"
    assert set(capacity.SHARDING) | set(memory.GROUP) | {"micro_batch_size"} <= set(LEVERS)
    assert set(ADAPTER_ROUTES) == set(ADAPTERS)
    levers = [n for n in LEVERS if n != "micro_batch_size"]
    assert list(Plan.of(1, micro_batch_size=8, grad_accum_steps=1).params()) == \
        ["micro_batch_size", "grad_accum_steps", *levers, "engine"]
    script = TrialConfig.of(8, 1, False, micro_batch_size=8)
    assert all(getattr(script, name) == getattr(script.config, name) for name in LEVERS)


@pytest.mark.parametrize("name", list(LEVERS))
def test_each_lever_is_a_field_of_the_plan_that_gives_its_kind_and_values(name: str) -> None:
    """The plan's sections hold every knob once, typed: a choice as a ``Literal`` of its values."""
    assert set(FIELDS) == {*LEVERS, "grad_accum_steps"}
    hint = typing.get_type_hints(SECTIONS[SECTION_OF[name]])[name]
    lever = LEVERS[name]
    assert lever.kind in (int, bool, str) and (lever.kind is str) == (typing.get_origin(hint) is typing.Literal)
    assert lever.choices == (typing.get_args(hint) if lever.kind is str else None), (name, hint)
    assert name == "micro_batch_size" or lever.parse(lever.default, name) == lever.default


def test_a_plan_holds_only_values_its_knobs_take() -> None:
    """Each section checks its values when it is made, whoever makes it; a recorded trial
    reads back whole, passing over a name no knob has."""
    base = {"micro_batch_size": 2, "grad_accum_steps": 1}
    for bad, said in (({"amp_dtype": "bf8"}, "amp_dtype: 'bf8' is not a value it takes ('fp32' | 'bf16' | 'fp16')"),
                      ({"compile": 1}, "compile: 1 is not a value it takes (true or false)"),
                      ({"num_workers": True}, "num_workers: True is not a value it takes (a whole number >= 0)"),
                      ({"micro_batch_size": 0}, "micro_batch_size: 0 is not a value it takes (a whole number >= 1)")):
        with pytest.raises(ValueError) as raised:
            Plan.of(2, **{**base, **bad})
        assert str(raised.value) == said
    plan = make_config({"amp_dtype": "bf16"}, 8, 2, Machine.detect())[0]
    assert Plan.recorded(2, {**plan.params(), "a_lever_since_removed": 3}) == plan
    with pytest.raises(RecipeError, match="^amp_dtype: 'bf8'"):  # a hand-edited best.json: one line, no traceback
        make_config({"amp_dtype": "bf8"}, 8, 2, Machine.detect())


@pytest.mark.parametrize("name", list(LEVERS))
def test_every_layer_shows_a_change_of_every_lever(name: str) -> None:
    """A configuration that moves one lever from its default, where the lever applies: the
    console's row names it (in its title or its levers column), the attribution's path from
    the default takes it as a step and its leave-one-out puts it back, and the guided walk
    tries it. These views are built from the registry; what is checked is what each does
    with the lever (a layer that drops one, as a formatter that skips an unknown name, fails
    here; the tables compared with each other, as before, could not fail)."""
    lever, context = LEVERS[name], _where_it_applies(name)
    base = make_config({**context, "micro_batch_size": 8}, 32, WORLD, ANY)[0].params()
    moved = make_config({**context, "micro_batch_size": 8, name: _other_value(lever)}, 32, WORLD, ANY)[0].params()
    assert moved[name] != base[name]
    if name not in TITLE:
        assert console.levers(moved) != console.levers(base), f"{name}: the console's row does not show it"
    steps = [step for step, _ in attribution.path(base, moved)[1:]]
    assert any(name in step.split("+") for step in steps), (name, steps)
    back = dict(attribution.leave_one_out(base, moved))
    assert any(config[name] == base[name] for config in back.values()), (name, back)
    assert name in guided.COORDINATE_ORDER and name in attribution.RISKS


def _where_it_applies(name: str) -> dict[str, Any]:
    for context in CONTEXTS:
        knobs = {**{k: v.default for k, v in LEVERS.items()}, **context}
        if applies(name, knobs, WORLD) and conflict(context) is None:
            return dict(context)
    raise AssertionError(f"{name}: applies in none of {CONTEXTS}")


def _other_value(lever: Lever) -> Any:
    if lever.kind is bool:
        return not lever.default
    if lever.choices:
        return next(v for v in lever.choices if v != lever.default)
    if lever.name == "micro_batch_size":
        return 4
    if lever.maximum is not None:
        return lever.maximum if lever.default != lever.maximum else lever.minimum
    return lever.default * 2 if lever.default else 2


def _file(name: str, config: Any) -> str:
    return exports.WRITERS[name](config, True)


def test_one_writer_per_config_to_paste() -> None:
    """The files the levers' declarations name are the writers' files, in the same order."""
    assert tuple(exports.WRITERS) == EXPORT_FILES


@pytest.mark.parametrize("name", list(LEVERS))
def test_every_lever_reaches_the_files_it_names(name: str) -> None:
    """Changing a lever changes each export file its declaration names: a lever an
    exporter forgets fails here, not in a user's pasted config."""
    lever, context = LEVERS[name], _where_it_applies(name)
    base = make_config({**context, "micro_batch_size": 8}, 32, WORLD, ANY)[0]
    moved = make_config({**context, "micro_batch_size": 8, name: _other_value(lever)}, 32, WORLD, ANY)[0]
    assert getattr(moved, name) != getattr(base, name), f"{name}: the other value did not apply"
    for file in lever.exported.fields:
        assert _file(file, base) != _file(file, moved), f"{name}: {file} does not change with it"


def test_the_refusals_name_a_value_and_a_fallback_the_lever_takes() -> None:
    bare = Machine(cuda=False, bf16=False, fp16=False, compiler=False, fsdp2=False, cudnn=False, in_order=False)
    for name, lever in LEVERS.items():
        for value, why, fallback in lever.refused(bare):
            assert lever.parse(value, name) == value and lever.parse(fallback, name) == fallback and why


def test_each_lever_that_moves_the_states_says_its_share() -> None:
    """The sharding and offload levers carry their memory term; the layout levers move the
    states through the parameters a rank holds (the memory model counts them per layout)."""
    with_term = {name for name, lever in LEVERS.items() if lever.memory.states}
    assert with_term == {name for name, lever in LEVERS.items() if lever.memory.effect == "states"
                         and lever.group == "sharding"}, with_term
    for name in with_term:
        shares = LEVERS[name].memory.states(Plan.of(4, micro_batch_size=1, grad_accum_steps=1), 4, False)
        assert shares == (1, 1, 1), (name, shares)  # at its default a lever keeps everything


NEW_LEVERS = ("compile_mode", "attention_backend", "float8", "expandable_segments", "fused_loss",
              "gradient_as_bucket_view", "static_graph")
"""The levers of a 2026 GPU and DDP's two added after the plan, each added as its declaration,
its functions and its exports."""
DECLARATION = ("inputs/plan.py", "inputs/engine.py", "inputs/rules.py")
"""Beside the registry package, where a lever is declared: its field, its engine label, the
rules that refuse a plan holding it."""
EXPORTS = ("inputs/library_configs.py", "outputs/exports.py")
"""Where a lever's exports are written: the library configs a trial runs with and the writers
of the configs to paste, one place (each file's writer names the fields it writes)."""


@pytest.mark.parametrize("name", NEW_LEVERS)
def test_a_lever_added_through_the_registry_is_named_in_at_most_four_places(name: str) -> None:
    """Its declaration, its functions, its exports, and at most one more: every layer reads
    the rest from the registry (the stages, the memory model, the diagnosis, the routes)."""
    assert len(_naming(name, imports=True)) <= 4, _naming(name, imports=True)


OLD_LEVERS = ("fsdp", "pipeline_parallel", "activation_checkpointing", "tensor_parallel")
"""The levers issue 35 found named all over the package (20, 10, 9 and 8 modules)."""


@pytest.mark.parametrize("name", OLD_LEVERS)
def test_the_layout_and_checkpointing_levers_are_named_in_at_most_six_modules(name: str) -> None:
    """Their declaration, their functions (the layout's arithmetic, the preparation, the
    exports, the model surgery), and nothing else: the engine label, the memory model, the
    diagnosis, the console, the guided walk and the measurement read the
    registry or the :class:`~tuner.inputs.layout.Layout` instead (issue 35's target)."""
    assert len(_naming(name)) <= 6, _naming(name)


def _naming(name: str, imports: bool = False) -> list[str]:
    """The modules of ``tuner/`` whose text holds ``name`` as a whole word (code, docstrings,
    messages; a PyTorch module path such as ``torch.distributed.fsdp`` included), and with
    ``imports`` those that import from the trial's module of the lever's functions a name
    whose definition holds it (loop.py once imported ``compile_mode``'s ``GraphShapes`` and
    escaped a count of words; :func:`_importing`). The registry package and :data:`DECLARATION`
    count once (a lever's family module, :mod:`~tuner.inputs.levers.orders`, the index of where
    every lever stands, its field in the plan and its engine label are its one declaration);
    :data:`EXPORTS` once."""
    import re

    word = re.compile(rf"\b{name}\b")
    registry = Path(levers.__file__).resolve().parent
    root = registry.parents[1]
    named = {str(p.relative_to(root)) for p in root.rglob("*.py") if word.search(p.read_text())}
    if imports:  # the lever's own trial modules import each other's functions: its functions, not a coupling
        coupled = _coupled(name, word, root)
        named |= {str(p.relative_to(root)) for p in root.rglob("*.py")
                  if ".".join(p.relative_to(root.parent).with_suffix("").parts) not in coupled
                  and _importing(p.read_text(), coupled)}
    here = {m for m in named if m.startswith(str(registry.relative_to(root))) or m in DECLARATION}
    exports = named & set(EXPORTS)
    places = (named - here - exports) | ({"inputs/levers/"} if here else set())
    return sorted(places | ({"exports"} if exports else set()))


APPLYING = ("tuner.trial.engines.gpu_levers", "tuner.trial.engines.model_levers", "tuner.trial.engines.stages")
"""The trial's modules of the levers' functions, and the stages that call them in order."""


def _coupled(name: str, word: Any, root: Path) -> dict[str, set[str]]:
    """The trial's modules of the levers' functions (:data:`APPLYING`: the registry is every
    layer's to read), each with the names defined there whose definition names the lever."""
    coupled: dict[str, set[str]] = {}
    for module in APPLYING:
        source = (root.parent / (module.replace(".", "/") + ".py")).read_text()
        coupled[module] = {node.name for node in ast.parse(source).body
                           if isinstance(node, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                           and word.search(ast.get_source_segment(source, node) or "")}
    return coupled


@pytest.mark.parametrize("name", [n for n, lever in LEVERS.items()
                                  if lever.applied.stage in ("forward", "convert", "model", "optimizer")])
def test_each_lever_of_a_trial_stage_is_read_where_the_stages_apply_it(name: str) -> None:
    """The stages call their levers' functions written out in order: a lever declared at one
    of them and read by none of those functions would never reach a trial."""
    root = Path(levers.__file__).resolve().parents[3]
    source = "".join((root / (module.replace(".", "/") + ".py")).read_text() for module in APPLYING)
    assert f"config.{name}" in source, f"{name}: declared at stage {LEVERS[name].applied.stage}, applied nowhere"


def _importing(source: str, coupled: dict[str, set[str]]) -> bool:
    """Whether a module's ``source`` imports one of ``coupled``'s names from its module."""
    return any(isinstance(node, ast.ImportFrom) and node.module in coupled
               and any(alias.name in coupled[node.module] for alias in node.names)
               for node in ast.walk(ast.parse(source)))


def test_the_count_of_modules_naming_a_lever_sees_an_import_of_its_functions() -> None:
    """The three-module count can fail on coupling through an import, not only on a word."""
    import re

    root = Path(levers.__file__).resolve().parents[2]
    coupled = _coupled("compile_mode", re.compile(r"\bcompile_mode\b"), root)
    assert _importing("from tuner.trial.engines.gpu_levers import GraphShapes\n", coupled)
    assert not _importing("from tuner.trial.engines.gpu_levers import attention_kernel\n", coupled)


def test_an_engine_is_named_only_in_its_table() -> None:
    """No module outside :mod:`tuner.inputs.engine` compares an engine label or the recipe's
    ``engine`` with an engine's name (``config.engine == "deepspeed"``): it asks the
    engine's facts (:func:`tuner.inputs.engine.kind`), so a new engine is a row of the
    table. Script mode's adapters' own mode names are not engines."""
    from tuner.inputs import engine

    assert all(engine.ENGINES[name].library == name for name in engine.LIBRARIES)  # each library's plain engine
    from tuner.trial.engines import RUNS

    assert set(RUNS) == set(engine.LIBRARIES)  # each library's engine runs from one row of one table
    names = set(engine.ENGINES) | set(engine.LIBRARIES)
    root = Path(levers.__file__).resolve().parents[1]

    def literals(node: ast.AST) -> set[Any]:
        if isinstance(node, ast.Constant):
            return {node.value}
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return {v for e in node.elts for v in literals(e)}
        return set()

    found = []
    for path in root.rglob("*.py"):
        if path == Path(engine.__file__):
            continue
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            if not isinstance(node, ast.Compare):
                continue
            operands = [node.left, *node.comparators]
            if any("engine" in (ast.get_source_segment(source, o) or "") for o in operands) \
                    and any(literals(o) & names for o in operands):
                found.append(f"{path.relative_to(root)}:{node.lineno} {ast.get_source_segment(source, node)}")
    assert not found, "\n".join(found)
