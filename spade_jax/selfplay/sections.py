"""A config section made from a stage's dataclass, and the dataclass read back from it.

Each default is written once, in the dataclass: `section` makes the ConfigDict section a preset
edits and the command line sets (every field of the dataclass, less the ones the run fills in),
and `from_section` builds the dataclass from it. The run config (`config.py`) and the side
systems' own sections (`components/`) are both made this way.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from typing import Any

import ml_collections
from ml_collections import config_dict


def field_defaults(target) -> dict[str, tuple[Any, Any]]:
    """``{name: (default, annotation)}`` of a dataclass's fields or a class's keyword arguments."""
    if dataclasses.is_dataclass(target):
        hints = typing.get_type_hints(target)
        out = {}
        for f in dataclasses.fields(target):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            out[f.name] = (default, hints.get(f.name))
        return out
    parameters = inspect.signature(target).parameters.values()
    return {p.name: (p.default, p.annotation) for p in parameters if p.default is not inspect.Parameter.empty}


def _config_value(default: Any, annotation: Any) -> Any:
    """``default`` as a ConfigDict value: dataclasses become sections, None a typed placeholder."""
    if dataclasses.is_dataclass(default):
        return section(type(default), **{k: getattr(default, k) for k in field_defaults(type(default))})
    if default is None:
        kinds = [a for a in typing.get_args(annotation) if a is not type(None)]
        return config_dict.placeholder(kinds[0] if len(kinds) == 1 else object)
    return default


def section(target, *, exclude: tuple[str, ...] = (), **values: Any) -> ml_collections.ConfigDict:
    """A config section holding the defaults of ``target`` (a dataclass or a class) less ``exclude``.

    ``values`` override those defaults or add the loop's own fields beside them.
    """
    fields = {name: _config_value(default, annotation)
              for name, (default, annotation) in field_defaults(target).items() if name not in exclude}
    for name, value in values.items():
        fields[name] = _config_value(value, None) if dataclasses.is_dataclass(value) else value
    return ml_collections.ConfigDict(fields)


def from_section(target, cfg: ml_collections.ConfigDict, **overrides: Any):
    """``target`` built from the fields of ``cfg`` it declares (lists as tuples, nested dataclasses
    from their sub-sections), then ``overrides``. Other fields of the section are the loop's."""
    values = {}
    for name, (default, _) in field_defaults(target).items():
        if name in overrides or name not in cfg:
            continue
        value = cfg[name]
        if dataclasses.is_dataclass(default):
            value = from_section(type(default), value)
        elif isinstance(value, list):
            value = tuple(value)
        values[name] = value
    return target(**values, **overrides)
