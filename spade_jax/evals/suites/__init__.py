"""Evaluation suites, one module each; every module registers its suite with `registry.register`."""
