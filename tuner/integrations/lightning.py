"""``tuner.Probe`` in a Lightning ``Trainer``: ``ProbeCallback`` (see
:mod:`tuner.scriptmode.callbacks.lightning`, where it lives beside the ``adapt: lightning``
adapter)::

    from tuner.integrations.lightning import ProbeCallback
    trainer = lightning.Trainer(..., callbacks=[ProbeCallback(warmup=10, measure=50)])
"""

from tuner.scriptmode.callbacks.lightning import ProbeCallback

__all__ = ["ProbeCallback"]
