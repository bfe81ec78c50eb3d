"""The learning ladder: rungs 0 and 1 (`sanity`, the agent alone), 2, 2b and 3 (`loop`, the designer and the whole loop)."""
