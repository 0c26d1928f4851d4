"""The small Llama-style model the parallel-layout helpers train (``tp_llama.py``,
``pp_llama.py``): transformers' own classes from a config, random weights from seed 0,
eager attention (the same kernels on every rank)."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(layers: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    config._attn_implementation = "eager"
    return LlamaForCausalLM(config)


def batch() -> torch.Tensor:
    """Four sequences of 32 tokens, the same on every rank."""
    return torch.randint(0, 256, (4, 32), generator=torch.Generator().manual_seed(1))
