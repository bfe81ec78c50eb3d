"""The presets, one file each: `python -m spade_jax.main --config=configs/<name>.py[:arg]`; importable as `configs.<name>` (`experiments.presets` loads them)."""
