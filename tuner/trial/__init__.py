"""One trial: a configuration trained for a warm-up and a measured window, in this process.

``run.py`` runs it (build, measure, tear down, ranks agree), ``loop.py`` is the measured
loop, ``after.py`` the steps after the window, ``data.py`` the loader, ``engines/`` the
plain/DDP and DeepSpeed engines, ``result.py`` what comes out and its :class:`State`.
"""
