"""A small Llama-style decoder from Hugging Face ``transformers``, built from its config with
random weights (nothing is downloaded), trained on random token sequences: the model the
parallel layout's levers (``tensor_parallel``, ``pipeline_parallel``) are shown on, since
its family ships a tensor-parallel plan and the tuner cuts its blocks into stages.

Needs the ``hf`` extra: ``pip install -e ".[hf]"``.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset


class RandomTokens(Dataset):
    """Deterministic pseudo-text: sample ``i`` is always the same sequence."""

    def __init__(self, size: int, seq_len: int, vocab_size: int) -> None:
        self.size, self.seq_len, self.vocab_size = size, seq_len, vocab_size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(index)
        return torch.randint(0, self.vocab_size, (self.seq_len,), generator=g)


def build_model(args: dict) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=args.get("vocab_size", 512),
        hidden_size=args.get("hidden_size", 64),
        intermediate_size=args.get("intermediate_size", 128),
        num_hidden_layers=args.get("layers", 4),
        num_attention_heads=args.get("heads", 4),
        num_key_value_heads=args.get("kv_heads", 2),
        max_position_embeddings=args.get("seq_len", 32),
        # eager by default: the same kernels on every rank and every layout; "sdpa" for a GPU run
        attn_implementation=args.get("attn_implementation", "eager"),
    )
    return LlamaForCausalLM(config)


def build_dataset(args: dict) -> Dataset:
    return RandomTokens(args.get("size", 1024), args.get("seq_len", 32), args.get("vocab_size", 512))


def compute_loss(model, batch: torch.Tensor) -> torch.Tensor:
    return model(input_ids=batch, labels=batch).loss


def tokens_per_sample(args: dict) -> int:
    return args.get("seq_len", 32)
