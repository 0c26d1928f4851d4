"""Trainer callbacks around ``tuner.Probe``: the probe in the Hugging Face and Lightning
trainers. Users import them from ``tuner.integrations``; the ``hf`` and ``lightning``
adapters add them to a script's trainer. Each is imported on its own, so neither library
is needed for the other."""
