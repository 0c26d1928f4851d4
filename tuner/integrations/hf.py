"""``tuner.Probe`` in a Hugging Face ``Trainer``: ``ProbeCallback`` (see
:mod:`tuner.scriptmode.callbacks.hf`, where it lives beside the ``adapt: hf`` adapter)::

    from tuner.integrations.hf import ProbeCallback
    trainer = Trainer(..., callbacks=[ProbeCallback(warmup=10, measure=50)])
"""

from tuner.scriptmode.callbacks.hf import ProbeCallback

__all__ = ["ProbeCallback"]
