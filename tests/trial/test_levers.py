"""The levers every engine shares, and all of them training for real under 2 gloo ranks
one after another in one process, with nothing left behind."""

from __future__ import annotations

import json
import types

import pytest
import torch

from tuner.trial.engines import model_levers as levers

from conftest import TESTS, torchrun, write_recipe

pytestmark = pytest.mark.slow

GPT2 = {"name": "levers", "task": str(TESTS.parent / "recipes" / "tasks" / "gpt2.py"),
        "task_args": {"seq_len": 64, "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 512},
        "global_batch_size": 16, "steps": {"warmup": 2, "measure": 5}}


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=3, n_head=2))


def test_the_blocks_are_found_and_said_or_taken_from_the_task():
    model = _gpt2()
    blocks, note = levers.find_blocks(model, None)
    assert blocks == list(model.transformer.h) and "transformer.h, 3 x GPT2Block" in note
    task = types.SimpleNamespace(blocks=lambda m: [m.transformer.h[0]])
    blocks, note = levers.find_blocks(model, task)
    assert blocks == [model.transformer.h[0]] and "from the task's blocks(model)" in note
    blocks, note = levers.find_blocks(torch.nn.Linear(2, 2), None)
    assert blocks == [] and "define blocks(model) in the task" in note
    with pytest.raises(ValueError, match="define blocks"):
        levers.checkpoint_blocks([], "full", levers.Recompute(True))


@pytest.mark.parametrize("mode, count", [("full", 5), ("selective", 3), ("none", 0)])
def test_checkpointing_recomputes_in_the_backward_and_keeps_the_gradients(mode, count):
    torch.manual_seed(0)
    plain = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(),
                                                      torch.nn.Linear(64, 16)) for _ in range(5)))
    torch.manual_seed(0)
    checked = torch.nn.Sequential(*(torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(),
                                                        torch.nn.Linear(64, 16)) for _ in range(5)))
    clock = levers.Recompute(timed=True)
    assert levers.checkpoint_blocks(list(checked), mode, clock) == count
    x = torch.randn(8, 16)
    plain(x).sum().backward()
    checked(x).sum().backward()
    for a, b in zip(plain.parameters(), checked.parameters()):
        assert torch.equal(a.grad, b.grad)  # recompute is exact
    assert len(clock.spans) == count  # one recompute per checkpointed block, timed in the backward only
    assert (clock.between(0, float("inf")) > 0) == (count > 0)


def test_optimizer_kernels_on_the_default_and_the_task_optimizer():
    assert levers.optimizer_kwargs("fused") == {"fused": True}
    sgd = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    assert all(g["fused"] for g in levers.apply_impl(sgd, "fused").param_groups)

    class Plain(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {"lr": 0.1})

    with pytest.raises(ValueError, match="has no fused implementation; remove fused from the space"):
        levers.apply_impl(Plain(torch.nn.Linear(2, 2).parameters()), "fused")


def test_every_lever_trains_under_two_ranks_in_one_process_and_leaves_nothing(tmp_path):
    """FSDP2 full / grad-op, full in bf16, checkpointing selective / full (with FSDP2 too),
    offload (FSDP2 and ZeRO-2), fused and foreach optimizers, buckets, compile (with bf16
    FSDP2 and checkpointing) on GPT-2 from transformers' config, then the reference again."""
    out = tmp_path / "rows.json"
    proc = torchrun(2, str(TESTS / "helpers" / "levers_matrix.py"), str(write_recipe(tmp_path, GPT2)), str(out))
    assert proc.returncode == 0, proc.stderr[-5000:]
    rows = json.loads(out.read_text())
    reference = rows[1]
    assert reference["knobs"] == {} and rows[-1]["knobs"] == {}
    for row in rows:
        knobs, params, m = row["knobs"], row["params"], row["metrics"]
        assert row["state"] == "ok", row
        assert row["live_parameters"] == 0, row  # no model survives its trial, compiled ones included
        assert params["engine"] == ("fsdp" if knobs.get("fsdp") else "deepspeed" if knobs.get("zero_stage")
                                    else "torch")
        assert all(params[k] == v for k, v in knobs.items())
        assert (m["compile_s"] is not None) == bool(knobs.get("compile")), row
        checkpointed = knobs.get("activation_checkpointing", "none") != "none"
        assert (m["recompute_share"] is not None and m["recompute_share"] > 0) == (
            checkpointed and not knobs.get("compile")), row
        # the loss curve against the fp32 eager reference: exact up to reduction order in
        # fp32, within the precision guard's default tolerance where the arithmetic changes
        gap = max(abs(a - b) / abs(b) for a, b in zip(row["losses"], reference["losses"]))
        exact = knobs.get("amp_dtype", "fp32") == "fp32" and not knobs.get("compile")
        assert gap <= (1e-5 if exact else 0.05), (knobs, gap)
    offloaded = next(r for r in rows if r["knobs"].get("zero_stage") and r["knobs"].get("offload_optimizer"))
    ds = offloaded["deepspeed"]  # what was measured is what ds_config.json says, and DeepSpeed read it so
    assert ds["given"] == ds["exported"] and ds["read"] == {"device": "cpu", "pin_memory": False}, ds
    assert any("blocks: 2 x GPT2Block (from the task's blocks(model))" in n for row in rows for n in row["notes"])
    assert len({row["process_groups"] for row in rows[rows.index(next(r for r in rows if r["knobs"].get(
        "zero_stage"))):]}) == 1  # after DeepSpeed's own groups, no trial leaves one behind
    first, again = reference["metrics"], rows[-1]["metrics"]
    assert again["peak_mem_gib"] <= first["peak_mem_gib"] * 1.10, (first["peak_mem_gib"], again["peak_mem_gib"])
    checkpointed_full = next(r for r in rows if r["knobs"] == {"activation_checkpointing": "full"})
    assert checkpointed_full["metrics"]["recompute_share"] > 0.05  # re-running every block costs real time
