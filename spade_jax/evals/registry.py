"""Suites by name: each module of `spade_jax.evals.suites` registers its own with `@register`.

A suite is named on the command line as ``prefix`` or ``prefix:argument`` (``envs:heldout/``,
``aime:data/aime25.jsonl``); the prefix picks the factory, which gets the argument (maybe
empty), its generation settings (the module's defaults, overridable in
``config.eval.generation.<prefix>``) and the eval config. Adding a suite is one file.
"""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
from typing import Any, Callable

from spade_jax.evals.suite import GenerationSettings, Suite

Factory = Callable[[str, GenerationSettings, Any], Suite]


@dataclasses.dataclass(frozen=True)
class Registered:
    prefix: str
    factory: Factory
    settings: GenerationSettings
    summary: str


_SUITES: dict[str, Registered] = {}


def register(prefix: str, settings: GenerationSettings = GenerationSettings(), summary: str = ""):
    """Registers ``factory(argument, settings, eval_config) -> Suite`` under ``prefix``."""

    def decorate(factory: Factory) -> Factory:
        if prefix in _SUITES and _SUITES[prefix].factory is not factory:
            raise ValueError(f"two suites registered as {prefix!r}")
        _SUITES[prefix] = Registered(prefix, factory, settings, summary or (factory.__doc__ or "").strip().split("\n")[0])
        return factory

    return decorate


def registered() -> dict[str, Registered]:
    """Every suite of `spade_jax.evals.suites` (importing a suite module imports no benchmark package)."""
    from spade_jax.evals import suites

    for module in pkgutil.iter_modules(suites.__path__):
        importlib.import_module(f"{suites.__name__}.{module.name}")
    return dict(sorted(_SUITES.items()))


def make_suite(spec: str, settings: GenerationSettings | None, eval_config: Any) -> Suite:
    """The suite ``spec`` names (``prefix[:argument]``) with ``settings`` (None: its defaults)."""
    prefix, _, argument = spec.partition(":")
    known = registered()
    if prefix not in known:
        raise ValueError(f"unknown suite {spec!r}; known: {', '.join(known)}")
    entry = known[prefix]
    return entry.factory(argument, settings or entry.settings, eval_config)
