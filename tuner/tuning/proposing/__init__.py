"""What the search measures next: the chain of proposers (``proposers``), the walk one change
at a time from the best (``guided``), and the filters between a proposal and a measurement
(``filters``)."""
