"""A Hugging Face Trainer script with no tuner code whose collator pads each batch to its
longest sequence: 16 tokens, but sample 699 of 1,024 (``adapt: hf`` tests of the batch of the
largest samples). The Trainer's seed-42 shuffle reads sample 699 next to last, so a measured
window never meets it and only the step on the batch of the largest does: its peak is the
larger by construction (a sample the shuffle read 55th had put a padded batch in the window).

    python hf_padded.py --output_dir /tmp/out --max_steps 20 --use_cpu
"""

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainingArguments


class Texts(Dataset):
    def __len__(self) -> int:
        return 2000

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        ids = [(i * 31 + j * 7) % 255 + 1 for j in range(1024 if i == 699 else 16)]
        return {"input_ids": ids, "labels": ids}


def pad(samples: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
    longest = max(len(s["input_ids"]) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    labels = torch.full((len(samples), longest), -100, dtype=torch.long)
    for row, s in enumerate(samples):
        ids[row, :len(s["input_ids"])] = torch.tensor(s["input_ids"])
        labels[row, :len(s["labels"])] = torch.tensor(s["labels"])
    return {"input_ids": ids, "labels": labels}


def main() -> None:
    (args,) = HfArgumentParser((TrainingArguments,)).parse_args_into_dataclasses()
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_positions=1024, n_embd=128, n_inner=2048, n_layer=2, n_head=2,
                                       vocab_size=256, bos_token_id=0, eos_token_id=0))
    Trainer(model=model, args=args, train_dataset=Texts(), data_collator=pad).train()


if __name__ == "__main__":
    main()
