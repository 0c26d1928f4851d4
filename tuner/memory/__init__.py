"""Memory before it is spent: the model that predicts a configuration's peak and learns from
every trial (``model``), and ``tuner plan``, what fits before a search (``plan``)."""
