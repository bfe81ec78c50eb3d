"""Held-out evaluation on benchmarks (issue 13): not written yet; the package is a placeholder."""
