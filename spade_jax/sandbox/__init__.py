"""sandbox stage."""
