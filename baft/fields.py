"""What a config dataclass says about its fields: the docstring under each one.

The configs document every field with a string right below it. Python keeps no such string at
run time, so a command line that shows them (``python -m baft.store --help``, the harness's flags
from its configs) reads them from the class's source with :mod:`ast`.
"""
from __future__ import annotations

import ast
import functools
import inspect
import re
import textwrap


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls`` (the string literal right after the field),
    as one line of plain text (reST's double backquotes and roles dropped); empty when the source
    cannot be read (a stripped install). Read once per class (a parser of nested configs asks for each
    class many times; reading the source is most of a command line's build)."""
    return dict(_read(cls))


@functools.cache
def _read(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef)).body
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            text = re.sub(r":\w+:`~?([^`]+)`", r"\1", after.value.value).replace("``", "")
            docs[node.target.id] = " ".join(text.split())
    return docs
