"""What a verdict advises: the levers it points at, less those this job cannot take (what it
already runs, what its model does not hold, what the search's rules or the machine refuse, and
what cannot reach a script), and how to search the rest."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from tuner.inputs import levers
from tuner.inputs.machine import Machine
from tuner.inputs.rules import applies


@dataclass(frozen=True)
class Step:
    """One thing a verdict advises: ``code`` names its words (:data:`tuner.outputs.diagnosis.STEPS`,
    ``"lever"``: the lever's own suggestion), ``lever`` the knob it moves (the trials' evidence
    takes the step out once they moved the knob there), ``figures`` fill the words."""

    code: str
    lever: str | None = None
    figures: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "lever": self.lever, "figures": dict(self.figures)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Step":
        return cls(data["code"], data.get("lever"), data.get("figures") or {})


@dataclass(frozen=True)
class Here:
    """What a search can run, for the advice (without it: what a CPU rules out).

    A verdict's suggestion passes the search space's refusal rules before it is shown: a CNN
    on a CPU was advised a fused attention kernel, and a micro-batch the global batch forbids."""

    refusal: Callable[[str, Any], str | None]
    """Why this configuration with ``lever = value`` cannot run here (``None``: it can)."""
    space: Mapping[str, tuple[Any, ...]]
    """The values the search may try, by lever: a suggestion outside them says how to add them."""
    routes: frozenset[str] | None = None
    """The knobs that reach a script (its adapter, ``knobs:``, ``env:``); ``None``: all."""


CPU_ONLY = Machine(cuda=False, bf16=True, fp16=False, cudnn=False)


def can_grow_micro(params: Mapping[str, Any]) -> bool:
    """Whether a larger micro-batch is advice this job can take: at a fixed global batch it
    needs accumulation steps to give up (one step already: the micro-batch is the rank's whole
    share; a larger one was advised where micro-batch 32 was the global batch of 32)."""
    return params.get("grad_accum_steps", 2) > 1


def remedies(kind: str, params: Mapping[str, Any], device: str, said: tuple[str, ...] = (),
             here: Here | None = None) -> list[Step]:
    """The levers a verdict points at (their ``suggest``, in its order), less those the
    configuration already follows or that it does not use (``compile_mode`` without
    ``compile``), those that act on what the model does not hold (``params["model"]``: what
    a trial recorded), those the verdict ``said`` in its own words and the values that cannot run:
    those the search's refusal rules reject (``here``), else, off a GPU, those a CPU cannot
    run. Values outside the search's space end it with how to add them (``add_space``), and
    knobs a script cannot receive with how to route them (``unrouted``)."""
    out: list[Step] = []
    add: dict[str, list[Any]] = {}
    unrouted: list[str] = []
    knobs = {**{n: lever.default for n, lever in levers.LEVERS.items()}, **params}
    for name in levers.pointed_at(kind):
        lever = levers.LEVERS[name]
        if lever.suggest is None or name in said:
            continue
        already = lever.suggest[0]
        if knobs[name] in already or not applies(name, knobs, 1):
            continue
        if lever.acts_on is not None and (knobs.get("model") or {}).get(lever.acts_on) is False:
            continue  # the model has nothing it acts on (what the trial recorded it holds)
        if lever.group == "batch" and lever.ordered and not can_grow_micro(params):
            continue  # no accumulation left to trade for a larger micro-batch
        if already and here is not None:
            runs = [v for v in already if here.refusal(name, v) is None]
        elif device != "cuda" and already:
            refused = {r[0] for r in lever.refused(CPU_ONLY)}
            runs = [v for v in already if v not in refused]
        else:
            runs = list(already)
        if already and not runs:
            continue
        if here is not None and runs and name in here.space and not set(runs) & set(here.space[name]):
            if here.routes is not None and name not in here.routes:
                unrouted.append(name)  # "add space" alone would be refused: the script cannot receive it
            else:
                add[name] = [*here.space[name], runs[0]]
        out.append(Step("lever", name, {"values": runs} if len(runs) < len(already) else {}))
    if add:  # the suggestions this search could not try: how to let it
        out.append(Step("add_space", figures={"space": add}))
    if unrouted:
        out.append(Step("unrouted", figures={"names": unrouted}))
    return out
