"""Pipeline stages of a Llama-style model (issue 27, second part): cut into two stages run by
PyTorch's own GPipe and 1F1B schedules on two gloo ranks, it trains with the whole model's
losses; what cannot be cut is refused with the rule."""

from __future__ import annotations

import json

import pytest

from tuner.trial import pipeline_stages as pp

from conftest import TESTS, torchrun

pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers")


def test_two_stages_under_gpipe_and_1f1b_train_as_the_whole_model(tmp_path):
    out = tmp_path / "pp.json"
    proc = torchrun(2, str(TESTS / "helpers" / "pp_llama.py"), str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["split"] == [[0, 1], [2]]  # 3 blocks on 2 stages: the first takes the remainder
    for schedule in ("gpipe", "1f1b"):
        assert got[schedule] == pytest.approx(got["reference"], rel=1e-5), (schedule, got)


def test_splits_and_refusals():
    assert [list(r) for r in pp.split(8, 3)] == [[0, 1, 2], [3, 4, 5], [6, 7]]
    with pytest.raises(ValueError, match="4 stages need at least 4 blocks; the model has 3"):
        pp.split(3, 4)
    bert = transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64))
    assert pp.supported(bert).startswith("BertForMaskedLM is neither a Llama-style decoder")
    assert "give the task a pipeline_split(model, n)" in pp.supported(bert)
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                                                bos_token_id=0, eos_token_id=0))
    assert pp.supported(gpt2) is None and pp.family(gpt2) == "gpt2"
    assert pp.tied(gpt2) == [gpt2.transformer.wte.weight]  # the head is the embedding: both ends hold it
    head = pp.stage(gpt2, 1, 2)
    assert head.positions is None and head.head is gpt2.lm_head and head.layers[0] is gpt2.transformer.h[1]
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=2))
    assert pp.tied(llama) == []  # Llama's head has its own weight
    first, last = pp.stage(llama, 0, 2), pp.stage(llama, 1, 2)
    assert first.embed is not None and first.head is None and len(first.layers) == 1
    assert last.embed is None and last.head is llama.lm_head and last.layers[0] is llama.model.layers[1]


def test_a_padded_batch_is_refused_and_a_batch_is_read_for_its_ids_and_labels():
    import torch

    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    labels = torch.tensor([[5, 6, -100], [8, 9, 10]])
    assert pp.input_ids(ids) is ids and pp.target_ids(ids) is ids
    assert pp.input_ids({"input_ids": ids, "labels": labels}) is ids
    assert pp.target_ids({"input_ids": ids, "labels": labels}) is labels
    assert pp.padding_refused({"input_ids": ids, "attention_mask": torch.ones_like(ids)}) is None
    why = pp.padding_refused({"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 0], [1, 1, 1]])})
    assert why.startswith("pipeline_parallel: this task's batches carry an attention_mask that masks padding")
    with pytest.raises(ValueError, match="needs batches of token ids"):
        pp.input_ids([ids])


@pytest.mark.parametrize("family,attention", [("llama", "sdpa"), ("llama", "eager"), ("gpt2", "sdpa"),
                                              ("gpt2", "eager")])
def test_a_stage_attends_causally_through_the_kernels_flag_where_the_model_does(monkeypatch, family, attention):
    """Under sdpa the stage passes no mask and SDPA runs its causal path (``is_causal``: the
    flash kernels, no L x L tensor), as the whole model does; under eager the explicit mask.
    Either way the one-stage cut computes the whole model's logits."""
    import torch

    torch.manual_seed(0)
    if family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=2, attn_implementation=attention))
    else:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=32, n_head=2, vocab_size=64, attn_implementation=attention, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0))
    model.eval()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    calls: list[tuple[bool, bool]] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(*args, **kwargs):
        calls.append((kwargs.get("attn_mask") is None, bool(kwargs.get("is_causal"))))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    with torch.no_grad():
        whole = model(input_ids=ids).logits
        calls.clear()
        cut = pp.stage(model, 0, 1)(ids)
    assert pp.causal_by_flag(model) is (attention == "sdpa")
    assert calls == ([(True, True)] * 2 if attention == "sdpa" else []), calls  # one per block, causal by flag
    torch.testing.assert_close(cut, whole, rtol=1e-5, atol=1e-5)
