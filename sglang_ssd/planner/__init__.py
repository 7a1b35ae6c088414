"""Pieces of the planner (``python -m sglang_ssd.planner``): :mod:`.rates` (the throughput model of AR,
SD and SSD — its one home), :mod:`.costs` (forward costs from a calibration), :mod:`.predict` (one
configuration's prediction from those costs), :mod:`.sweep` with :mod:`.rounds` (a sweep's records
against the predictions) and :mod:`.depth` (a three-level chain against a two-level one)."""
