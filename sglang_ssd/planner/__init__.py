"""Pieces of the planner (``python -m sglang_ssd.plan``): forward costs from a calibration, rate
formulas in ms, and a sweep's records against the predictions."""
