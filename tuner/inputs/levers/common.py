"""What the family modules share: the script-mode adapters that deliver a lever themselves."""

from __future__ import annotations

from tuner.inputs.lever import ADAPTERS

ALL = frozenset(ADAPTERS)
REBUILT = frozenset(ADAPTERS) - {"hf"}
"""Adapters that rebuild the script's training DataLoader (hf sets TrainingArguments'
``dataloader_*`` fields instead, and they have no ``in_order``)."""
TRAINER = frozenset({"hf", "lightning", "accelerate", "deepspeed"})
"""Adapters whose library takes the batch and precision (the torch adapter only watches)."""
