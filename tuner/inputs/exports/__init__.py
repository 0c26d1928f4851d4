"""The configs to paste, one module per family of libraries (:mod:`tuner.inputs.export` is their face)."""
