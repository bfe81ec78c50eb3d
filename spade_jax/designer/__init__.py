"""designer stage."""
