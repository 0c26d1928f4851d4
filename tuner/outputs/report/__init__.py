"""report.md and report.html: the run folder's report, its sections and its plots."""
