"""The configs to paste, one module per family of libraries (:mod:`tuner.config.export` is their face)."""
