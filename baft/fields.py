"""What a config dataclass says about its fields: the docstring under each one.

The configs document every field with a string right below it. Python keeps no such string at
run time, so a command line that wants to show them (``--help``) reads them from the source.
"""
from __future__ import annotations

import ast
import inspect
import textwrap


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its docstring (whitespace collapsed) for every documented field of ``cls``;
    empty when the source cannot be read (a frozen or stripped install)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    body = ast.parse(source).body[0].body  # type: ignore[attr-defined]
    out: dict[str, str] = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            out[node.target.id] = " ".join(after.value.value.split())
    return out
