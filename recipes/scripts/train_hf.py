"""A Hugging Face ``Trainer`` script, tuned in script mode.

A small GPT-2 built from its config (random weights: nothing is downloaded) on token
sequences read with a fixed latency each, as from storage. Two additions make it tunable:
``tuner.config`` gives the TrainingArguments their batch, accumulation, loader and
precision fields (the script's own defaults outside the tuner), and
``tuner.integrations.hf.ProbeCallback`` measures the Trainer's steps and reports them:

    torchrun --nproc_per_node=2 recipes/scripts/train_hf.py --max-steps 20
    python -m tuner.search recipes/script_hf.yaml
"""

import argparse
import tempfile
import time

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

import tuner
from tuner.integrations.hf import ProbeCallback


class Tokens(Dataset):
    """Fixed random token sequences, each read with ``latency_ms`` of waiting."""

    def __init__(self, size: int, seq_len: int, vocab: int, latency_ms: float) -> None:
        self.size, self.seq_len, self.vocab, self.latency = size, seq_len, vocab, latency_ms / 1000

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        time.sleep(self.latency)
        ids = torch.randint(0, self.vocab, (self.seq_len,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=100)
    parser.add_argument("--latency-ms", type=float, default=3.0)
    args = parser.parse_args()
    cfg = tuner.config(num_workers=0, micro_batch_size=8, amp_dtype="fp32", global_batch_size=16)

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_positions=64, n_embd=64, n_layer=2, n_head=2, vocab_size=512,
                                       bos_token_id=0, eos_token_id=0))
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            output_dir=out, max_steps=args.max_steps, learning_rate=3e-4, report_to=[], save_strategy="no",
            logging_strategy="no", use_cpu=not torch.cuda.is_available(), disable_tqdm=True, seed=0,
            ddp_find_unused_parameters=False,
            **cfg.hf_training_args(),
        )
        trainer = Trainer(model=model, args=training, train_dataset=Tokens(4096, 64, 512, args.latency_ms),
                          callbacks=[ProbeCallback(warmup=3, stop_when_done=cfg.tuned)])
        trainer.train()


if __name__ == "__main__":
    main()
