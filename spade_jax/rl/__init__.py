"""rl stage."""
