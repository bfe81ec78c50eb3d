"""selfplay stage."""
