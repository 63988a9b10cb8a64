"""Records: the dataclasses analysis writes to JSON (``verdict.json`` and its parts) and reads back.

A record is written as the mapping of its fields, in their order, nested records as mappings
and lists as lists; that mapping is the file format, so a field's name is its key. Reading
takes the keys that name fields; a key a record does not know (a newer file) is ignored and a
field the file lacks (an older file) takes its default. A record holding other records reads
them in its own ``from_json``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

R = TypeVar("R", bound="Record")


class Record:
    """Base of a record dataclass: ``to_json`` and ``from_json`` for records of plain fields."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        """The JSON-ready mapping of the fields."""
        return {f.name: plain(getattr(self, f.name)) for f in dataclasses.fields(self)}  # type: ignore[arg-type]

    @classmethod
    def from_json(cls: type[R], data: dict[str, Any]) -> R:
        """The record ``to_json`` wrote (fields of plain values; records with nested ones override this)."""
        return cls(**known(cls, data))


def plain(value: Any) -> Any:
    """``value`` with every record in it replaced by its mapping."""
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def known(cls: type, data: dict[str, Any]) -> dict[str, Any]:
    """The items of ``data`` that name an init field of dataclass ``cls``."""
    return {f.name: data[f.name] for f in dataclasses.fields(cls) if f.init and f.name in data}


def optional(cls: type[R], data: dict[str, Any] | None) -> R | None:
    """``cls.from_json(data)``, or None for a null."""
    return None if data is None else cls.from_json(data)
