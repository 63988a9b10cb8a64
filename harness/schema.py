"""Map plain YAML/JSON data onto config dataclasses, with errors that name the key path.

The scenario file is a public contract, and the config dataclasses of each
component are its one source of truth: this module walks a dataclass's type
hints (``int``, ``float``, ``str``, ``bool``, ``Literal``, ``list[...]``,
``X | None``, nested dataclasses) and builds the instance, rejecting unknown
keys and wrong types before anything runs. Range checks live in each config's
``__post_init__``; a ``ValueError`` carrying a ``field`` attribute there is
reported at that field's path.
"""
from __future__ import annotations

import dataclasses
import types
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from harness.errors import ScenarioError

T = TypeVar("T")

_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a mapping"}


def describe(tp: Any) -> str:
    """A human phrase for a type, used in 'expected ...' messages."""
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in get_args(tp))
    if origin in (list, tuple):
        args = get_args(tp)
        return f"a list of {describe(args[0])}" if args else "a list"
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in get_args(tp) if a is not type(None)) + " (or null)"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return _TYPE_NAMES.get(tp, getattr(tp, "__name__", str(tp)))


def found_repr(value: Any) -> Any:
    """What to show as 'found': containers summarised, scalars as they are."""
    if isinstance(value, dict):
        return "<a mapping>"
    if isinstance(value, list):
        return "<a list>"
    return value


def convert(value: Any, tp: Any, file: str, path: str) -> Any:
    """Check ``value`` against type ``tp`` and build nested dataclasses."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        real = [a for a in args if a is not type(None)]
        if len(real) == 1:  # an optional value: its own error says more than "X (or null)"
            return convert(value, real[0], file, path)
        for arg in args:
            if arg is type(None):
                continue
            try:
                return convert(value, arg, file, path)
            except ScenarioError:
                continue
        raise ScenarioError(file, path, describe(tp), found_repr(value))
    if origin is Literal:
        if value not in get_args(tp):
            raise ScenarioError(file, path, describe(tp), value)
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ScenarioError(file, path, describe(tp), found_repr(value))
        (item,) = get_args(tp) or (Any,)
        return [convert(v, item, file, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build(tp, value, file, path)
    if tp is bool:
        if not isinstance(value, bool):
            raise ScenarioError(file, path, describe(tp), found_repr(value))
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScenarioError(file, path, describe(tp), found_repr(value))
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ScenarioError(file, path, describe(tp), found_repr(value))
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ScenarioError(file, path, describe(tp), found_repr(value))
        return value
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise ScenarioError(file, path, describe(dict), found_repr(value))
        return value
    raise TypeError(f"schema: unsupported type {tp!r} at {path}")


def build(cls: type[T], data: Any, file: str, path: str = "") -> T:
    """Build dataclass ``cls`` from mapping ``data``; every error names ``file`` and the key path."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError(file, path, "a mapping", found_repr(data))
    nest = getattr(cls, "nest_renamed", None)  # keys that moved: warned about, taken at their new paths
    if nest is not None:
        try:
            data = nest(data, path or cls.__name__, file)
        except ValueError as e:
            raise _scenario_error(e, file, path) from None
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]  # T: a dataclass
    unknown = [k for k in data if k not in fields]
    if unknown:
        where = f"{path}.{unknown[0]}" if path else str(unknown[0])
        raise ScenarioError(file, where, "one of the keys " + ", ".join(sorted(fields)), "<an unknown key>")
    missing = [
        n for n, f in fields.items()
        if n not in data and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        where = f"{path}.{missing[0]}" if path else missing[0]
        raise ScenarioError(file, where, describe(hints[missing[0]]), "<nothing: the key is required>")
    kwargs = {k: convert(v, hints[k], file, f"{path}.{k}" if path else k) for k, v in data.items()}
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise _scenario_error(e, file, path) from None


def _scenario_error(e: ValueError, file: str, path: str) -> ScenarioError:
    """A config's own error (a :class:`~baft.errors.BaftConfigError` names its field) at its key path."""
    field = getattr(e, "field", None)
    if field is not None:
        where = f"{path}.{field}" if path else field
        return ScenarioError(file, where, e.expected, e.found)  # type: ignore[attr-defined]
    return ScenarioError(file, path or "<top>", "valid values", f"<{e}>")


def to_plain(obj: Any) -> Any:
    """A dataclass tree as plain dicts/lists (the inverse of :func:`build`)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj

