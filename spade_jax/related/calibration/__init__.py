"""Difficulty calibration (EvoEnv), a related system: `calibrate.py`. Joined to a run as an
admission stage by `selfplay/components/calibration.py`."""
