"""Type checks of a filter against the kinds its attributes are known to have.

The filter language accepts any comparison, and one between different kinds is simply
false (docs/filters.md), so ``Price < 'abc'`` never matches a numeric Price without any
error. A client that knows the kinds (from notifications it received) checks a filter
with :func:`check_types` before subscribing and tells the user.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mdeci.errors import FilterError
from mdeci.filters import And, Attrs, CmpOp, Compare, Expr, Not, Or, format_literal, value_kind


class FilterTypeError(FilterError):
    """A comparison whose result never depends on the notification, because its attribute
    is of another kind than its literal (``Price < 'abc'`` where Price is a number: never
    true; ``Price != 'abc'``: always true)."""

    def __init__(self, reason: str) -> None:
        super().__init__(0, reason)
        self.args = (reason,)  # no position: the fault is the comparison's meaning


def kinds_seen(samples: Iterable[Attrs]) -> dict[str, str]:
    """The kind (``number``, ``string``, ``bool``) of each attribute in ``samples`` that
    always had the same kind; an attribute seen with two kinds has none."""
    kinds: dict[str, str] = {}
    mixed: set[str] = set()
    for attrs in samples:
        for name, value in attrs.items():
            kind = value_kind(value)
            if kinds.setdefault(name, kind) != kind:
                mixed.add(name)
    return {name: kind for name, kind in kinds.items() if name not in mixed}


def _comparisons(expr: Expr) -> Iterable[Compare]:
    if isinstance(expr, Compare):
        yield expr
    elif isinstance(expr, Not):
        yield from _comparisons(expr.operand)
    elif isinstance(expr, And | Or):
        for operand in expr.operands:
            yield from _comparisons(operand)


def check_types(expr: Expr, kinds: Mapping[str, str]) -> None:
    """Raise :class:`FilterTypeError` for the first comparison whose literal is of another
    kind than its attribute's in ``kinds`` (see :func:`kinds_seen`), or that orders a
    boolean. Such a comparison is false for every notification (``!=`` true), which the
    filter language accepts; a client that knows the attributes' kinds uses this to tell
    the user before subscribing."""
    for cmp in _comparisons(expr):
        literal = format_literal(cmp.value)
        kind = kinds.get(cmp.name)
        if kind is not None and kind != value_kind(cmp.value):
            # Between kinds `!=` is true and every other operator false (docs/filters.md).
            always = "always" if cmp.op is CmpOp.NE else "never"
            raise FilterTypeError(
                f"{cmp.name} is a {kind}, so '{cmp.name} {cmp.op.value} {literal}' compares "
                f"it with a {value_kind(cmp.value)} and is {always} true",
            )
        if kind == "bool" and cmp.op not in (CmpOp.EQ, CmpOp.NE):
            raise FilterTypeError(
                f"{cmp.name} is a bool: '{cmp.op.value}' is never true for booleans"
            )
