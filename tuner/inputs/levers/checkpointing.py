"""The checkpointing lever: recompute in the backward instead of holding activations, per
block (full, selective) or per operator (op). Its model surgery is
:func:`tuner.trial.engines.model_levers.checkpointing`; its exports are written by
:mod:`tuner.outputs.exports` (and ``TrainingArguments``' fields by
:mod:`tuner.inputs.library_configs`).
"""

from __future__ import annotations

from tuner.inputs.lever import Applied, Exported, Lever, MemoryTerm, ScriptRoutes

DECLARED: tuple[Lever, ...] = (
    Lever("activation_checkpointing",
          "recompute activations in the backward: every block's whole forward (full), every other block's "
          "(selective), or each block's cheap operators, its matmul and attention outputs kept (op)",
          aliases=((False, "none"), (None, "none")), group="model",
          ordered=True, reference="none",
          risk="recompute: the backward re-runs the checkpointed blocks' forwards (RNG state is replayed, so "
               "dropout matches)", label="ac={}", proven=True,
          applied=Applied("model"),
          exported=Exported({"hf_training_args.json": "activation_checkpointing",
                             "torchtitan.toml": "activation_checkpoint",
                             "accelerate_config.yaml": "fsdp_config.fsdp_activation_checkpointing",
                             "torch_settings.py": "op_context (op)"}),
          memory=MemoryTerm("activations", prior={"none": 1.0, "op": 0.6, "selective": 0.5, "full": 0.1},
                            frees_activations=("selective", "full")),
          script=ScriptRoutes(frozenset({"hf"}))),
)
