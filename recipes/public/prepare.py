"""Local data for the public training scripts tuned by the recipes beside this file, so
that nothing is downloaded: nanoGPT's token files, minGPT's chargpt text, a text file
with a tokenizer for transformers' run_clm.py, a folder of JPEGs for timm's train.py, and
for transformers' run_classification.py two CSV files, a 2-layer BERT and an accuracy metric.

    git clone https://github.com/karpathy/nanoGPT ../nanoGPT     # beside this repository
    git clone https://github.com/karpathy/minGPT ../minGPT
    mkdir ../run_clm && cp TRANSFORMERS/examples/pytorch/language-modeling/run_clm.py ../run_clm/
    python recipes/public/prepare.py ../nanoGPT ../minGPT ../run_clm
    python recipes/public/prepare.py --timm ../pytorch-image-models    # alone, or with the above
    mkdir ../run_classification
    cp TRANSFORMERS/examples/pytorch/text-classification/run_classification.py ../run_classification/
    python recipes/public/prepare.py --run-classification ../run_classification

nanoGPT reads ``data/<dataset>/train.bin`` / ``val.bin`` (uint16 tokens) and ``meta.pkl``
(its vocabulary size); chargpt reads ``input.txt`` in its own folder; run_clm.py reads
``--train_file`` and ``--tokenizer_name`` (a byte-level BPE trained here on the same text);
timm's train.py reads ``--data-dir data``: ``train/`` and ``validation/``, a folder a class
of 160x160 JPEGs (decoded, resized and augmented per sample, as a real image folder is);
run_classification.py reads ``train.csv`` / ``validation.csv`` (``sentence``, ``label``), a
model folder (``model/``: a randomly initialised 2-layer BERT with its tokenizer, saved as
``from_pretrained`` reads it) and ``--metric_name accuracy.py`` (``evaluate.load`` of a
local metric: its own "accuracy" comes from the Hub).
All get seeded random content: the tuner measures speed, not what the model learns.
"""

import argparse
import pickle
import random
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("nanogpt", type=Path, nargs="?", help="a nanoGPT checkout")
    parser.add_argument("mingpt", type=Path, nargs="?", help="a minGPT checkout")
    parser.add_argument("run_clm", type=Path, nargs="?", help="the folder holding transformers' run_clm.py")
    parser.add_argument("--timm", type=Path, help="a pytorch-image-models checkout")
    parser.add_argument("--run-classification", type=Path, help="the folder holding run_classification.py")
    args = parser.parse_args()
    if args.timm is not None:
        _images(args.timm / "data")
        print(f"wrote {args.timm / 'data'}")
    if args.run_classification is not None:
        _classification(args.run_classification)
        print(f"wrote train.csv, validation.csv, model/ and accuracy.py in {args.run_classification}")
    if args.nanogpt is None or args.mingpt is None:
        if args.timm is None and args.run_classification is None:
            parser.error("give a nanoGPT and a minGPT checkout, --timm or --run-classification")
        return
    data = args.nanogpt / "data" / "tuner_random"
    data.mkdir(parents=True, exist_ok=True)
    tokens = np.random.default_rng(0).integers(0, 65, size=1_000_000, dtype=np.uint16)
    tokens[:900_000].tofile(data / "train.bin")
    tokens[900_000:].tofile(data / "val.bin")
    (data / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": 65}))
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(500)]
    # chargpt samples from the prompt "O God, O God!" as it trains: its letters must be in the text
    text = "O God, O God! " + " ".join(rng.choice(words) for _ in range(200_000))
    (args.mingpt / "projects" / "chargpt" / "input.txt").write_text(text)
    print(f"wrote {data} and {args.mingpt / 'projects' / 'chargpt' / 'input.txt'}")
    if args.run_clm is not None:
        lines = [" ".join(rng.choice(words) for _ in range(60)) for _ in range(4000)]
        (args.run_clm / "train.txt").write_text("\n".join(lines) + "\n")
        _tokenizer(lines, args.run_clm / "tokenizer")
        print(f"wrote {args.run_clm / 'train.txt'} and {args.run_clm / 'tokenizer'}")


def _images(folder: Path, train: int = 3072, validation: int = 64) -> None:
    """Two classes of seeded random 160x160 JPEGs in ``train/`` and ``validation/``."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", train), ("validation", validation)):
        for label in range(2):
            target = folder / split / f"class{label}"
            target.mkdir(parents=True, exist_ok=True)
            for i in range(count // 2):
                pixels = rng.integers(0, 255, (160, 160, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(target / f"{i}.jpg", quality=90)


ACCURACY = '''"""Accuracy, as evaluate's Hub metric of that name computes it (written by prepare.py)."""
import datasets
import evaluate


class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="the share of predictions equal to their references", citation="", inputs_description="",
            features=datasets.Features({"predictions": datasets.Value("int32"), "references": datasets.Value("int32")}))

    def _compute(self, predictions, references):
        return {"accuracy": sum(int(p == r) for p, r in zip(predictions, references)) / len(references)}
'''


def _classification(folder: Path) -> None:
    """Sentences of random words labelled 0 / 1, a 2-layer BERT with a 512-token tokenizer."""
    import csv

    from transformers import BertConfig, BertForSequenceClassification

    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(500)]
    lines = [" ".join(rng.choice(words) for _ in range(rng.randint(20, 60))) for _ in range(4096)]
    for name, rows in (("train.csv", lines[:4000]), ("validation.csv", lines[4000:])):
        with open(folder / name, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["sentence", "label"])
            writer.writerows((line, rng.randint(0, 1)) for line in rows)
    model = folder / "model"
    _tokenizer(lines, model, pad=True)
    config = BertConfig(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128, max_position_embeddings=128, num_labels=2)
    BertForSequenceClassification(config).save_pretrained(model)
    (folder / "accuracy.py").write_text(ACCURACY)


def _tokenizer(lines: list[str], folder: Path, pad: bool = False) -> None:
    """A 512-token byte-level BPE, saved the way AutoTokenizer.from_pretrained reads it
    (``pad``: its end-of-text token pads too, for a script that pads to a fixed length)."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(lines, vocab_size=512, special_tokens=["<|endoftext|>"])
    extra = {"pad_token": "<|endoftext|>"} if pad else {}
    fast = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer,  # noqa: SLF001 - the fast tokenizer object
                                   bos_token="<|endoftext|>", eos_token="<|endoftext|>", model_max_length=1024, **extra)
    fast.save_pretrained(folder)


if __name__ == "__main__":
    main()
