"""The learning studies, a subpackage each with its command and a README of its current results; bench/ holds the speed benchmarks."""
