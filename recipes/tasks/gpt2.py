"""A small GPT-2 from Hugging Face ``transformers``, built from its config with random
weights (nothing is downloaded), trained on random token sequences.

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
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=args.get("vocab_size", 2048),
        n_positions=args.get("seq_len", 64),
        n_embd=args.get("n_embd", 128),
        n_layer=args.get("n_layer", 2),
        n_head=args.get("n_head", 4),
        # GPT-2's dropout (0.1) draws from each rank's RNG: layouts that cut the model
        # differently draw differently; 0 makes every layout compute the same step
        resid_pdrop=args.get("dropout", 0.1), embd_pdrop=args.get("dropout", 0.1), attn_pdrop=args.get("dropout", 0.1),
        bos_token_id=0,  # GPT-2's 50256 lies outside a small vocabulary
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


def build_dataset(args: dict) -> Dataset:
    return RandomTokens(args.get("size", 2048), args.get("seq_len", 64), args.get("vocab_size", 2048))


def compute_loss(model, batch: torch.Tensor) -> torch.Tensor:
    return model(input_ids=batch, labels=batch).loss


def tokens_per_sample(args: dict) -> int:
    return args.get("seq_len", 64)


def flops_per_sample(args: dict) -> float:
    """6 x parameters x tokens (forward + backward), the usual estimate; embeddings included."""
    d, layers = args.get("n_embd", 128), args.get("n_layer", 2)
    vocab, seq = args.get("vocab_size", 2048), args.get("seq_len", 64)
    params = 12 * layers * d * d + vocab * d
    return 6.0 * params * seq


def blocks(model) -> list:
    """The transformer blocks: what FSDP2 shards, checkpointing recomputes and compile compiles
    one at a time (the tuner would find the same ModuleList; naming it makes it explicit)."""
    return list(model.transformer.h)
