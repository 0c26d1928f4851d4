"""A LightningCLI script with no tuner code (``adapt: lightning`` tests): the model, the
data module and the Trainer's settings all come from the command line, as

    python lightning_cli_train.py fit --trainer.max_epochs=100 --data.batch_size=16
"""

import lightning.pytorch as pl
from flags_train import Reads  # beside this script: the same slow reads
from lightning.pytorch.cli import LightningCLI
from lightning_train import Classifier
from torch.utils.data import DataLoader


class ReadsData(pl.LightningDataModule):
    def __init__(self, batch_size: int = 16, num_workers: int = 0, latency_ms: float = 3.0) -> None:
        super().__init__()
        self.batch_size, self.num_workers, self.latency_ms = batch_size, num_workers, latency_ms

    def train_dataloader(self) -> DataLoader:
        return DataLoader(Reads(4096, self.latency_ms), batch_size=self.batch_size, num_workers=self.num_workers,
                          shuffle=True, drop_last=True)


if __name__ == "__main__":
    LightningCLI(Classifier, ReadsData, save_config_callback=None)
