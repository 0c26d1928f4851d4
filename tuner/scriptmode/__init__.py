"""Script mode: the user's own training script, each trial its own ``torchrun``.

``config.py`` is ``tuner.config`` (the knobs inside the script), ``probe.py`` the public
``tuner.Probe``, ``trialfile.py`` how a trial and the search talk, ``launcher.py`` runs and
ends a trial's process tree, ``adapters/`` apply knobs to scripts with no tuner code,
``agent.py`` runs the other nodes' side of several-node trials.
"""
