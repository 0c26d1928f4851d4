"""Tensor parallelism by the model's own plan (issue 27, first part): the loss of the sharded
model equals the unsharded one's on two gloo ranks; what cannot split is refused."""

from __future__ import annotations

import json

import pytest

from tuner.trial import tensor_parallel

from conftest import TESTS, torchrun

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")


def test_a_llama_model_sharded_by_its_own_plan_trains_as_the_unsharded_one(tmp_path):
    out = tmp_path / "tp.json"
    proc = torchrun(2, str(TESTS / "helpers" / "tp_llama.py"), str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["modules"] == 2 * 7  # q, k, v, o, gate, up, down in each of the two blocks
    assert got["q_global"] == [64, 64] and got["q_local"] == [32, 64]  # colwise: half the rows each
    for before, after in zip(got["reference"], got["sharded"]):
        assert after == pytest.approx(before, rel=1e-5), got  # the step after the first too
    assert "LlamaConfig.base_model_tp_plan" in got["said"]
    # sequence parallelism: the same losses, the norms on half the sequence (4 x 32 tokens: 16 each)
    assert got["sequence"] == pytest.approx(got["reference"], rel=1e-5), got
    assert got["norm_output"] == [4, 16, 64] and "sharded over the sequence" in got["said_sp"]
    assert got["said_vocab"] == "embedding and head split over the vocabulary" and got["head_local"] == [128, 64]


def test_what_cannot_split_is_refused_with_its_rule_and_a_model_without_a_plan_says_so():
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=1, num_attention_heads=6,
        num_key_value_heads=2))
    assert tensor_parallel.refused(llama, 2) is None
    assert tensor_parallel.refused(llama, 4) == ("tensor_parallel: 4 does not divide num_attention_heads (6); "
                                                 "each rank needs whole ones")
    assert "num_key_value_heads (2)" in tensor_parallel.refused(llama, 3)
    bert = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64))
    plan, said = tensor_parallel.plan_of(bert)
    assert plan is None and said.startswith("BertForMaskedLM ships no tensor-parallel plan")
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64,
                                                                bos_token_id=0, eos_token_id=0))
    plan, said = tensor_parallel.plan_of(gpt2)  # no plan shipped: the tuner's own, Megatron-LM's split of Conv1D
    assert "the tuner's own for GPT-2" in said and set(tensor_parallel.matches(gpt2, plan)) == {
        "transformer.h.0.attn.c_attn", "transformer.h.0.attn.c_proj", "transformer.h.0.mlp.c_fc",
        "transformer.h.0.mlp.c_proj"}
    assert tensor_parallel.refused(gpt2, 4) == ("tensor_parallel: 4 does not divide num_attention_heads (2); "
                                                "each rank needs whole ones")
    plan, _ = tensor_parallel.plan_of(llama)
    assert set(tensor_parallel.matches(llama, plan)) == {
        f"model.layers.0.{m}" for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                        "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
