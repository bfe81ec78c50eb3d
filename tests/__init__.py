"""The tests, laid out as the code: tests/<package>/ tests spade_jax/<package>/, tests/test_<module>.py a
top-level module of spade_jax; tests/conformance/ holds the reference's rules across packages,
tests/experiments/ and tests/bench/ the studies and benchmarks, tests/repo/ the layout, launchers and
notebook. Data and helpers one folder uses sit in it; those several use (conftest.py's fixtures,
sandbox_examples/, hostile_admission/, special_tokens.py) sit here."""
