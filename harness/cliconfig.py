"""Command-line flags from a config dataclass, and the config back from the flags given.

A component's config (``BenchConfig``, ``DeployConfig``, ``FuzzConfig``) is the one place its options live:
each field becomes a flag named after it (``persist_every`` -> ``--persist-every``) with the field's type, its
default and, as help, the docstring under the field (read from the class's source,
:func:`baft.fields.field_docs`). A flag not given leaves the field's default; the config's own checks
(``__post_init__``) judge the values, and a value they refuse is a :class:`~harness.errors.UsageError` naming
the flag.

A field whose type is itself a config dataclass is a *section*: its fields become flags under the section's
path, as the scenario's keys are (``BenchConfig.checkpoint.baft.writer`` -> ``--checkpoint.baft.writer``),
shown in a group of their own in ``--help``. A config may name, in class attributes:

* ``FLAGLESS``: paths (relative to it) that get no flag, because the component sets them itself;
* ``RENAMED_FLAGS``: old flag names -> the paths that replaced them. The old flag still works for a release,
  with a warning naming the new one, and is left out of ``--help``.

Types: ``int``, ``float``, ``str``, ``Literal[...]`` (the choices), ``bool`` (``--x`` / ``--no-x``),
``list[str]`` and ``list[int]`` (comma-separated) and ``X | None`` of those (the flag gives an X; not giving
it leaves the default).
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

from baft.errors import deprecated
from baft.fields import field_docs

from harness.errors import UsageError

C = TypeVar("C")


def flag(name: str) -> str:
    """The flag of field (or path) ``name``: ``persist_every`` -> ``--persist-every``, ``checkpoint.async_dcp.mode``
    -> ``--checkpoint.async-dcp.mode``."""
    return "--" + name.replace("_", "-")


def _plain_type(tp: Any) -> Any:
    """``X`` for ``X | None``; ``tp`` otherwise."""
    if get_origin(tp) in (Union, types.UnionType):
        real = [a for a in get_args(tp) if a is not type(None)]
        if len(real) == 1:
            return real[0]
    return tp


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _default(f: dataclasses.Field[Any]) -> Any:
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def _shown(value: Any) -> str:
    """A default as the user would type it."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return ",".join(map(str, value))
    return str(value)


@dataclasses.dataclass(frozen=True)
class _Option:
    """One flag-carrying field, found by walking a config and its sections."""

    path: str
    """Its dotted path from the top config (``checkpoint.baft.writer``)."""
    name: str
    """Its flag's name: the path, less the sections that are ``FLAT`` (``--job-dir`` for ``follow.job_dir``)."""
    tp: Any
    """Its type, ``X`` for ``X | None``."""
    default: Any
    """Its default in the top config (a section's default instance decides, as it does for the config)."""
    doc: str
    """The docstring under it."""
    section: str
    """The path of the section it is in ("" at the top)."""


def _options(cls: type, prefix: str = "", base: Any = None, skip: frozenset[str] = frozenset(),
             named: str = "") -> Iterator[_Option]:
    """Every flag-carrying field of ``cls`` and its sections, depth first (``base``: the section's default
    instance; ``skip``: paths below ``prefix`` that get no flag, with the class's own ``FLAGLESS``; ``named``:
    the flag names' prefix)."""
    docs, hints = field_docs(cls), get_type_hints(cls)
    skip = skip | frozenset(getattr(cls, "FLAGLESS", ()))
    flat = set(getattr(cls, "FLAT", ()))
    for f in dataclasses.fields(cls):
        path = prefix + f.name
        if not f.init or f.name in skip:
            continue
        if f.name not in docs:
            raise TypeError(f"{cls.__name__}.{f.name}: a config field needs a docstring (its flag's help)")
        tp = _plain_type(hints[f.name])
        default = getattr(base, f.name) if base is not None else _default(f)
        if _is_section(tp):
            below = frozenset(p[len(f.name) + 1:] for p in skip if p.startswith(f.name + "."))
            yield from _options(tp, path + ".", default, below, named if f.name in flat else named + f.name + ".")
        else:
            yield _Option(path, named + f.name, tp, default, docs[f.name], prefix[:-1])


def _kind(o: _Option) -> dict[str, Any]:
    """argparse's keywords for option ``o``'s type; ``TypeError`` for a type no flag carries."""
    tp = o.tp
    if tp is bool:
        return {"action": argparse.BooleanOptionalAction}
    if get_origin(tp) is Literal:
        choices = get_args(tp)
        return {"type": type(choices[0]), "choices": choices}
    if get_origin(tp) is list and get_args(tp) in ((str,), (int,)):
        return {"type": str, "metavar": o.path.rsplit(".", 1)[-1].upper() + ",..."}
    if tp in (int, float, str, Path):
        return {"type": tp, "metavar": o.path.rsplit(".", 1)[-1].upper()}
    raise TypeError(f"{o.path}: no flag for a field of type {tp!r}")


def add_config_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type) -> None:
    """A flag per init field of config dataclass ``cls`` and of its sections on ``parser``, and its
    ``RENAMED_FLAGS`` as hidden aliases that warn (see the module's docstring).

    Raises ``TypeError`` for a field without a docstring or of a type no flag can carry: every option
    of a command is documented where it is defined.
    """
    groups: dict[str, Any] = {"": parser}
    section_docs = _section_docs(cls)
    by_path: dict[str, _Option] = {}
    options = list(_options(cls))
    # A docstring names other fields (``dry_run``); the help names their flags (--dry-run).
    named = {o.path.rsplit(".", 1)[-1]: flag(o.name) for o in options if "_" in o.path.rsplit(".", 1)[-1]}
    pattern = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, named)) + r")(?![\w-])") if named else None
    for o in options:
        by_path[o.path] = o
        kw: dict[str, Any] = {"default": argparse.SUPPRESS, "dest": o.path, **_kind(o)}
        doc = pattern.sub(lambda m: named[m.group(1)], o.doc) if pattern else o.doc
        help_text = doc.replace("%", "%%")
        if get_origin(o.tp) is list:
            help_text += " Comma-separated."
        required = o.default is dataclasses.MISSING
        if not required and o.default is not None:
            help_text += f" (default {_shown(o.default).replace('%', '%%')})"
        section = o.section if o.name != o.path.rsplit(".", 1)[-1] else ""  # a FLAT section's flags: with the others
        if section not in groups:
            groups[section] = parser.add_argument_group(section.replace("_", "-"), section_docs.get(section))
        groups[section].add_argument(flag(o.name), required=required, help=help_text, **kw)
    for old, new in getattr(cls, "RENAMED_FLAGS", {}).items():
        o = by_path[new]
        kw = {"default": argparse.SUPPRESS, "dest": o.path, **_kind(o)}
        action = kw.pop("action", _StoreAction)
        parser.add_argument(flag(old), help=argparse.SUPPRESS, action=_renamed(action, new), **kw)


def _section_docs(cls: type, prefix: str = "") -> dict[str, str]:
    """Each section's path -> the docstring of the field that holds it (the group's description in ``--help``)."""
    out: dict[str, str] = {}
    docs, hints = field_docs(cls), get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = _plain_type(hints[f.name])
        if f.init and _is_section(tp):
            out[prefix + f.name] = docs.get(f.name, "").replace("%", "%%")
            out.update(_section_docs(tp, prefix + f.name + "."))
    return out


_StoreAction: type[argparse.Action] = type(argparse.ArgumentParser().add_argument("--x"))
"""argparse's ``store`` action (its class is private)."""


def _renamed(action: type[argparse.Action], new: str) -> type[argparse.Action]:
    """``action`` that first warns that the flag it was given by is deprecated, naming ``new``'s flag."""

    class Renamed(action):  # type: ignore[valid-type,misc]
        def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                     option_string: str | None = None) -> None:
            old = option_string or ""
            now = ("--no-" + flag(new)[2:]) if old.startswith("--no-") else flag(new)
            deprecated(old, now)
            super().__call__(parser, namespace, values, option_string)

    return Renamed


def config_from_args(cls: type[C], args: argparse.Namespace) -> C:
    """The config the flags of ``args`` give (flags from :func:`add_config_arguments`); a field whose
    flag was not given keeps its default, a section none of whose flags was given its default instance. A
    value the config refuses raises :class:`UsageError` naming the flag."""
    built = _build(cls, args, "", None)
    return built if built is not None else cls()


def _value(o_tp: Any, path: str, raw: Any) -> Any:
    """A flag's value as its field takes it (comma-separated lists split)."""
    if get_origin(o_tp) is not list:
        return raw
    value = [x.strip() for x in raw.split(",") if x.strip()]
    if get_args(o_tp) == (int,):
        try:
            return [int(x) for x in value]
        except ValueError:
            raise UsageError(f"{flag(path)}: expected comma-separated integers, found {raw!r}") from None
    return value


def _build(cls: type[C], args: argparse.Namespace, prefix: str, base: Any, named: str = "") -> C | None:
    """``cls`` (at ``prefix``; its flags named from ``named``) from the flags given: ``base`` (its default
    instance, None at the top or for an optional section) with them applied; None when no flag of it or its
    sections was given."""
    hints = get_type_hints(cls)
    flat = set(getattr(cls, "FLAT", ()))
    given: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not f.init:
            continue
        path, tp = prefix + f.name, _plain_type(hints[f.name])
        if _is_section(tp):
            inner = _build(tp, args, path + ".", getattr(base, f.name) if base is not None else _default(f),
                           named if f.name in flat else named + f.name + ".")
            if inner is not None:
                given[f.name] = inner
        elif hasattr(args, path):
            given[f.name] = _value(tp, named + f.name, getattr(args, path))
    if not given and prefix:
        return None
    try:
        return dataclasses.replace(base, **given) if base is not None else cls(**given)
    except ValueError as e:
        if not hasattr(e, "field"):
            raise
        raise flag_error(e, named) from None


def flag_error(e: Any, prefix: str = "") -> UsageError:
    """A config field's refusal (an error with ``field``, ``expected`` and ``found``) as the user sees it: the
    flag, what was expected, what was found."""
    return UsageError(f"{flag(prefix + e.field)}: expected {e.expected}, found {e.found!r}")


def argv_of(cfg: Any, changed_only: bool = False) -> list[str]:
    """The flags that give ``cfg`` (``--x=V``, so a value may start with ``-``; ``--x``/``--no-x`` for a bool);
    with ``changed_only``, only those whose value differs from the default: the shortest command line."""
    out: list[str] = []
    for o in _options(type(cfg)):
        v = cfg
        for part in o.path.split("."):
            v = getattr(v, part) if v is not None else None
        if v is None or (changed_only and v == o.default):
            continue
        if isinstance(v, bool):
            out.append(flag(o.name) if v else "--no-" + flag(o.name)[2:])
        else:
            out.append(f"{flag(o.name)}={','.join(map(str, v)) if isinstance(v, list) else v}")
    return out
