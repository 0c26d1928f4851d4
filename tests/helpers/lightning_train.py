"""A Lightning script with no tuner code (``adapt: lightning`` tests): its own batch size,
workers and precision in the code, a validation loader (the sanity check runs it first).

    torchrun --nproc_per_node=2 lightning_train.py --latency-ms 3
"""

import argparse

import lightning.pytorch as pl
import torch
from flags_train import Reads  # beside this script: the same slow reads
from torch import nn
from torch.utils.data import DataLoader


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency-ms", type=float, default=3.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    train = DataLoader(Reads(4096, args.latency_ms), batch_size=16, shuffle=True, drop_last=True)
    val = DataLoader(Reads(64, 0.0), batch_size=5)
    trainer = pl.Trainer(max_epochs=100, accelerator="cpu", devices="auto", precision="32-true",
                         enable_progress_bar=False, enable_model_summary=False, logger=False,
                         enable_checkpointing=False, num_sanity_val_steps=2, val_check_interval=50)
    trainer.fit(Classifier(), train_dataloaders=train, val_dataloaders=val)


if __name__ == "__main__":
    main()
