"""What a search leaves for people: the run folder (``run_folder``), the report
(``report``, its text in ``markdown``, its page and plots in ``plots``), the commands'
printing (``console``) and the live table while a search runs (``live``)."""
