"""A Hugging Face Trainer script with no tuner code: TrainingArguments from the command
line through HfArgumentParser, the way the transformers example scripts take them
(``adapt: hf`` tests).

    torchrun --nproc_per_node=2 hf_train.py --output_dir /tmp/out --max_steps 20 --use_cpu
"""

import time
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainerCallback, TrainingArguments


@dataclass
class DataArguments:
    latency_ms: float = 3.0
    """Each sequence's read time."""


class Tokens(Dataset):
    def __init__(self, size: int, latency_ms: float) -> None:
        self.size, self.latency = size, latency_ms / 1000

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        time.sleep(self.latency)
        sum(range(20_000))  # ~0.5 ms of decoding work: loader workers show CPU time (10 ms ticks)
        ids = torch.randint(0, 256, (32,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


class SayEngine(TrainerCallback):
    """Prints, once, what the Trainer's first step ran on: the optimizer DeepSpeed wrapped
    (its ZeRO optimizer and stage) or the plain one, and the precision."""

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        if state.global_step == 1:
            inner = getattr(optimizer, "optimizer", optimizer)
            stage = 3 if type(inner).__name__.endswith("Stage3") else (
                2 if getattr(inner, "partition_gradients", False) else 1) if "Zero" in type(inner).__name__ else 0
            print(f"engine: {type(inner).__name__}, zero stage {stage}, bf16 {args.bf16}", flush=True)


def main() -> None:
    data_args, training_args = HfArgumentParser((DataArguments, TrainingArguments)).parse_args_into_dataclasses()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_positions=32, n_embd=32, n_layer=1, n_head=2, vocab_size=256,
                                       bos_token_id=0, eos_token_id=0))
    Trainer(model=model, args=training_args, train_dataset=Tokens(4096, data_args.latency_ms),
            callbacks=[SayEngine()]).train()


if __name__ == "__main__":
    main()
