"""Speed and route benchmarks, one script each (`python bench/<name>.py`); their current figures are in bench/RESULTS.md."""
