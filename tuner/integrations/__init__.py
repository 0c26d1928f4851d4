"""``tuner.Probe`` inside the trainers people already use.

* :mod:`tuner.integrations.hf`: a Hugging Face ``Trainer`` callback (``pip install 'tuner[hf]'``).
* :mod:`tuner.integrations.lightning`: a Lightning callback (``pip install 'tuner[lightning]'``).

Each is imported on its own, so neither library is needed for the other.
"""
