"""The user's input, parsed once into typed objects: the recipe (``recipe``), the knobs and
one complete configuration (``space``), the task file (``task``), the configs to paste
(``export``), and the errors a user can act on (``errors``). Called, ``tuner.config(**defaults)``
is a script's knobs (:func:`tuner.scriptmode.config.config`; made callable in ``tuner/__init__.py``)."""
