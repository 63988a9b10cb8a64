"""Command-line flags from a config dataclass, and the config back from the flags given.

A component's config (``BenchConfig``, ``DeployConfig``) is the one place its options live: each field
becomes a flag named after it (``persist_every`` -> ``--persist-every``) with the field's type, its
default and, as help, the docstring under the field (read from the class's source,
:func:`baft.fields.field_docs`). A flag not given leaves the field's default; the
config's own checks (``__post_init__``) judge the values, and a value they refuse is a
:class:`~harness.errors.UsageError` naming the flag.

Types: ``int``, ``float``, ``str``, ``Literal[...]`` (the choices), ``bool`` (``--x`` / ``--no-x``),
``list[str]`` (comma-separated) and ``X | None`` of those (the flag gives an X; not giving it
leaves the default).
"""
from __future__ import annotations

import argparse
import dataclasses
import types
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from baft.fields import field_docs

from harness.errors import ConfigValueError, UsageError

C = TypeVar("C")


def flag(name: str) -> str:
    """The flag of field ``name``: ``persist_every`` -> ``--persist-every``."""
    return "--" + name.replace("_", "-")


def _plain_type(tp: Any) -> Any:
    """``X`` for ``X | None``; ``tp`` otherwise."""
    if get_origin(tp) in (Union, types.UnionType):
        real = [a for a in get_args(tp) if a is not type(None)]
        if len(real) == 1:
            return real[0]
    return tp


def _shown(value: Any) -> str:
    """A default as the user would type it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


def add_config_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """A flag per init field of config dataclass ``cls`` on ``parser`` (see the module's docstring).

    Raises ``TypeError`` for a field without a docstring or of a type no flag can carry: every option
    of a command is documented where it is defined.
    """
    docs, hints = field_docs(cls), get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        if f.name not in docs:
            raise TypeError(f"{cls.__name__}.{f.name}: a config field needs a docstring (its flag's help)")
        tp = _plain_type(hints[f.name])
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        required = default is dataclasses.MISSING
        help_text = docs[f.name].replace("%", "%%")
        kw: dict[str, Any] = {"default": argparse.SUPPRESS}
        if tp is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif get_origin(tp) is Literal:
            choices = get_args(tp)
            kw.update(type=type(choices[0]), choices=choices)
        elif get_origin(tp) is list and get_args(tp) in ((str,), (int,)):
            kw.update(type=str, metavar=f.name.upper() + ",...")
            help_text += " Comma-separated."
        elif tp in (int, float, str):
            kw["type"] = tp
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: no flag for a field of type {hints[f.name]!r}")
        if not required and default is not None:
            help_text += f" (default {_shown(default).replace('%', '%%')})"
        parser.add_argument(flag(f.name), required=required, help=help_text, **kw)


def config_from_args(cls: type[C], args: argparse.Namespace) -> C:
    """The config the flags of ``args`` give (flags from :func:`add_config_arguments`); a field whose
    flag was not given keeps its default. A value the config refuses raises :class:`UsageError`."""
    hints = get_type_hints(cls)
    given = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.init and hasattr(args, f.name):
            value = getattr(args, f.name)
            tp = _plain_type(hints[f.name])
            if get_origin(tp) is list:
                value = [x.strip() for x in value.split(",") if x.strip()]
                if get_args(tp) == (int,):
                    try:
                        value = [int(x) for x in value]
                    except ValueError:
                        raise UsageError(f"{flag(f.name)}: expected comma-separated integers, found "
                                         f"{getattr(args, f.name)!r}") from None
            given[f.name] = value
    try:
        return cls(**given)
    except ConfigValueError as e:
        raise flag_error(e) from None


def flag_error(e: ConfigValueError) -> UsageError:
    """A config field's refusal as the user sees it: the flag, what was expected, what was found."""
    return UsageError(f"{flag(e.field)}: expected {e.expected}, found {e.found!r}")
