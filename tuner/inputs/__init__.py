"""The user's input, parsed once into typed objects: the recipe (``recipe``), the knobs and
one complete configuration (``space``), the task file (``task``), the configs to paste
(``export``), and the errors a user can act on (``errors``). A script's knobs are the function
``tuner.config(**defaults)`` (:func:`tuner.scriptmode.config.config`), not this package."""
