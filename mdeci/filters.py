"""The filter language of docs/protocol.md §5 (subjects and patterns: ``mdeci.subjects``).

Theory of operation
-------------------
A *filter* is a boolean expression over a notification's attributes. The text is read by a
hand-written tokenizer and a recursive-descent parser (grammar in ``docs/filters.md``) into
an AST of frozen dataclasses, then compiled once into a closure. Python's ``eval`` is never
used: filters come from remote peers. Limits (:data:`MAX_FILTER_LENGTH`,
:data:`MAX_DEPTH`) bound the work and the recursion a hostile filter can cause.

Semantics (chosen so that a filter never raises at match time):

- the empty filter (or only whitespace) matches everything;
- a comparison whose attribute is missing is false, whatever the operator, so
  ``not (x == 1)`` is true when ``x`` is missing while ``x != 1`` is false;
- values have three kinds: strings, numbers (int and float, compared numerically) and
  booleans. ``==`` between different kinds is false and ``!=`` true (no coercion:
  ``true != 1`` and ``'1' != 1``); ordering (``< <= > >=``) is defined between two numbers
  or two strings (code point order) and is false for anything else;
- ``exists(name)`` is true when the attribute is present, whatever its value;
- ``prefix(name, 'text')`` is true when the attribute is a string starting with ``text``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from mdeci.errors import FilterError
from mdeci.subjects import COMPILED_CACHE

AttrValue = str | int | float | bool
Attrs = Mapping[str, AttrValue]
Predicate = Callable[[Attrs], bool]

# ---------------------------------------------------------------------------------------
# Filter language: AST
# ---------------------------------------------------------------------------------------

MAX_FILTER_LENGTH = 4096  # characters; longer filters are refused before tokenizing
MAX_DEPTH = 32  # nested parentheses and 'not's; bounds the parser's recursion
MAX_NAME_LENGTH = 64
INT_MIN = -(2**63)
INT_MAX = 2**63 - 1
RESERVED = frozenset({"and", "or", "not", "true", "false", "exists", "prefix"})
Literal = str | int | float | bool


class CmpOp(Enum):
    """Comparison operators; the value is the text of the operator."""

    EQ = "=="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="


@dataclass(frozen=True, slots=True)
class MatchAll:
    """The empty filter: matches every notification."""


@dataclass(frozen=True, slots=True)
class Compare:
    """``name <op> literal``."""

    name: str
    op: CmpOp
    value: Literal


@dataclass(frozen=True, slots=True)
class Exists:
    """``exists(name)``."""

    name: str


@dataclass(frozen=True, slots=True)
class Prefix:
    """``prefix(name, 'text')``."""

    name: str
    text: str


@dataclass(frozen=True, slots=True)
class Not:
    """``not operand``."""

    operand: Expr


@dataclass(frozen=True, slots=True)
class And:
    """``a and b and ...`` (two or more operands, flattened)."""

    operands: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Or:
    """``a or b or ...`` (two or more operands, flattened)."""

    operands: tuple[Expr, ...]


Expr = MatchAll | Compare | Exists | Prefix | Not | And | Or

# ---------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------


class _Tok(Enum):
    NAME = "attribute name"
    STRING = "string"
    NUMBER = "number"
    LPAREN = "'('"
    RPAREN = "')'"
    COMMA = "','"
    OP = "comparison operator"
    KEYWORD = "keyword"
    EOF = "end of filter"


@dataclass(frozen=True, slots=True)
class _Token:
    kind: _Tok
    pos: int
    text: str  # the source text of the token
    value: Literal | CmpOp | None = None

    def describe(self) -> str:
        if self.kind is _Tok.EOF:
            return "end of filter"
        return repr(self.text) if len(self.text) <= 20 else repr(self.text[:17] + "...")


_ESCAPES = {"\\": "\\", "'": "'", '"': '"', "n": "\n", "t": "\t", "r": "\r", "0": "\0"}
_WS = " \t\r\n"
_OPS = ("==", "!=", "<=", ">=", "<", ">")


def _is_name_start(ch: str) -> bool:
    return ch == "_" or ("a" <= ch <= "z") or ("A" <= ch <= "Z")


def _is_name_char(ch: str) -> bool:
    return _is_name_start(ch) or ("0" <= ch <= "9")


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in _WS:
            i += 1
        elif ch in "(),":
            kind = {"(": _Tok.LPAREN, ")": _Tok.RPAREN, ",": _Tok.COMMA}[ch]
            tokens.append(_Token(kind, i, ch))
            i += 1
        elif ch in "=!<>":
            op = next((o for o in _OPS if text.startswith(o, i)), None)
            if op is None:
                hint = "; did you mean '=='?" if ch == "=" else ""
                raise FilterError(i, f"unexpected character {ch!r}{hint}")
            tokens.append(_Token(_Tok.OP, i, op, CmpOp(op)))
            i += len(op)
        elif ch in "'\"":
            i = _read_string(text, i, tokens)
        elif ch == "-" or ("0" <= ch <= "9"):
            i = _read_number(text, i, tokens)
        elif _is_name_start(ch):
            start = i
            while i < n and _is_name_char(text[i]):
                i += 1
            word = text[start:i]
            if word in RESERVED:
                value: Literal | None = {"true": True, "false": False}.get(word)
                tokens.append(_Token(_Tok.KEYWORD, start, word, value))
            else:
                if len(word) > MAX_NAME_LENGTH:
                    raise FilterError(
                        start, f"attribute name longer than {MAX_NAME_LENGTH} characters"
                    )
                tokens.append(_Token(_Tok.NAME, start, word, word))
        else:
            raise FilterError(i, f"unexpected character {ch!r}")
    tokens.append(_Token(_Tok.EOF, n, ""))
    return tokens


def _read_string(text: str, start: int, tokens: list[_Token]) -> int:
    quote = text[start]
    out: list[str] = []
    i, n = start + 1, len(text)
    while i < n:
        ch = text[i]
        if ch == quote:
            tokens.append(_Token(_Tok.STRING, start, text[start : i + 1], "".join(out)))
            return i + 1
        if ch == "\\":
            if i + 1 >= n:
                break
            esc = text[i + 1]
            if esc in _ESCAPES:
                out.append(_ESCAPES[esc])
                i += 2
            elif esc == "u":
                digits = text[i + 2 : i + 6]
                if len(digits) != 4 or any(c not in "0123456789abcdefABCDEF" for c in digits):
                    raise FilterError(i, "invalid escape: \\u needs four hex digits")
                code = int(digits, 16)
                if 0xD800 <= code <= 0xDFFF:
                    # A lone surrogate cannot be encoded as UTF-8 (CBOR text, churn logs).
                    raise FilterError(i, "invalid escape: surrogate code point")
                out.append(chr(code))
                i += 6
            else:
                raise FilterError(i, f"invalid escape '\\{esc}'")
        else:
            out.append(ch)
            i += 1
    raise FilterError(start, "unterminated string")


def _read_number(text: str, start: int, tokens: list[_Token]) -> int:
    i, n = start, len(text)

    def digits(at: int, after: str) -> int:
        j = at
        while j < n and "0" <= text[j] <= "9":
            j += 1
        if j == at:
            raise FilterError(at, f"expected a digit after {after!r}")
        return j

    if text[i] == "-":
        i += 1
    i = digits(i, "-") if i > start else digits(i, "")
    is_float = False
    if i < n and text[i] == ".":
        is_float = True
        i = digits(i + 1, ".")
    if i < n and text[i] in "eE":
        is_float = True
        j = i + 1
        if j < n and text[j] in "+-":
            j += 1
        i = digits(j, text[j - 1])
    if i < n and (_is_name_char(text[i]) or text[i] == "."):
        raise FilterError(i, f"unexpected character {text[i]!r} after a number")
    source = text[start:i]
    value: int | float
    if is_float:
        value = float(source)
        if not math.isfinite(value):
            raise FilterError(start, "number out of range")
    else:
        # Checking the length first avoids int()'s quadratic path on huge digit strings.
        if len(source.lstrip("-")) > 19:
            raise FilterError(start, "integer out of range (64-bit)")
        value = int(source)
        if not INT_MIN <= value <= INT_MAX:
            raise FilterError(start, "integer out of range (64-bit)")
    tokens.append(_Token(_Tok.NUMBER, start, source, value))
    return i


# ---------------------------------------------------------------------------------------
# Parser (recursive descent; grammar in docs/filters.md)
# ---------------------------------------------------------------------------------------


class _Parser:
    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens = tokens
        self.i = 0
        self.depth = 0

    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def is_kw(self, word: str) -> bool:
        return self.tok.kind is _Tok.KEYWORD and self.tok.text == word

    def take(self) -> _Token:
        tok = self.tok
        if tok.kind is not _Tok.EOF:
            self.i += 1
        return tok

    def fail(self, expected: str) -> FilterError:
        return FilterError(self.tok.pos, f"expected {expected}, found {self.tok.describe()}")

    def expect(self, kind: _Tok) -> _Token:
        if self.tok.kind is not kind:
            raise self.fail(kind.value)
        return self.take()

    def enter(self, pos: int) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise FilterError(pos, f"filter nested deeper than {MAX_DEPTH} levels")

    def at_end(self) -> bool:
        return self.tok.kind is _Tok.EOF

    def parse(self) -> Expr:
        if self.at_end():
            return MatchAll()
        expr = self.or_expr()
        if not self.at_end():
            raise self.fail("'and', 'or' or end of filter")
        return expr

    def or_expr(self) -> Expr:
        operands = [self.and_expr()]
        while self.is_kw("or"):
            self.take()
            operands.append(self.and_expr())
        return operands[0] if len(operands) == 1 else Or(_flatten(Or, operands))

    def and_expr(self) -> Expr:
        operands = [self.not_expr()]
        while self.is_kw("and"):
            self.take()
            operands.append(self.not_expr())
        return operands[0] if len(operands) == 1 else And(_flatten(And, operands))

    def not_expr(self) -> Expr:
        if self.is_kw("not"):
            self.enter(self.take().pos)
            operand = self.not_expr()
            self.depth -= 1
            return Not(operand)
        return self.primary()

    def primary(self) -> Expr:
        tok = self.tok
        if tok.kind is _Tok.LPAREN:
            self.enter(self.take().pos)
            expr = self.or_expr()
            self.expect(_Tok.RPAREN)
            self.depth -= 1
            return expr
        if self.is_kw("exists"):
            self.take()
            self.expect(_Tok.LPAREN)
            name = self.name()
            self.expect(_Tok.RPAREN)
            return Exists(name)
        if self.is_kw("prefix"):
            self.take()
            self.expect(_Tok.LPAREN)
            name = self.name()
            self.expect(_Tok.COMMA)
            if self.tok.kind is not _Tok.STRING:
                raise self.fail("a quoted string")
            text = self.take().value
            assert isinstance(text, str)
            self.expect(_Tok.RPAREN)
            return Prefix(name, text)
        if tok.kind is _Tok.NAME:
            name = self.name()
            if self.tok.kind is not _Tok.OP:
                raise self.fail(f"a comparison operator after {name!r}")
            op = self.take().value
            assert isinstance(op, CmpOp)
            return Compare(name, op, self.literal())
        raise self.fail("an attribute name, 'not', 'exists', 'prefix' or '('")

    def name(self) -> str:
        if self.tok.kind is not _Tok.NAME:
            raise self.fail("an attribute name")
        return self.take().text

    def literal(self) -> Literal:
        tok = self.tok
        if tok.kind in (_Tok.STRING, _Tok.NUMBER) or (
            tok.kind is _Tok.KEYWORD and tok.text in ("true", "false")
        ):
            self.take()
            assert tok.value is not None and not isinstance(tok.value, CmpOp)
            return tok.value
        raise self.fail("a string, number, 'true' or 'false'")


def _flatten(kind: type[And] | type[Or], operands: list[Expr]) -> tuple[Expr, ...]:
    # '(a and b) and c' is the same as 'a and b and c'; one node keeps printing canonical.
    out: list[Expr] = []
    for op in operands:
        if isinstance(op, kind):
            out.extend(op.operands)
        else:
            out.append(op)
    return tuple(out)


def parse_filter(text: str) -> Expr:
    """Parse filter text into an AST; empty or blank text gives :class:`MatchAll`.

    Raises :class:`FilterError` with the 0-based position of the fault, for text longer
    than :data:`MAX_FILTER_LENGTH`, nested deeper than :data:`MAX_DEPTH`, or that does
    not follow the grammar.
    """
    if len(text) > MAX_FILTER_LENGTH:
        raise FilterError(MAX_FILTER_LENGTH, f"filter longer than {MAX_FILTER_LENGTH} characters")
    return _Parser(_tokenize(text)).parse()


# ---------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------


def _quote(text: str) -> str:
    out = ["'"]
    for ch in text:
        if ch in "\\'":
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif not ch.isprintable() and ord(ch) <= 0xFFFF and not 0xD800 <= ord(ch) <= 0xDFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    out.append("'")
    return "".join(out)


def format_literal(value: Literal) -> str:
    """The filter text of a literal (strings single-quoted with escapes)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return _quote(value)
    return repr(value)


def format_filter(expr: Expr) -> str:
    """Print an AST as filter text that parses back to the same AST.

    Parentheses are added only where precedence needs them (``not`` > ``and`` > ``or``),
    so the printed text is never nested deeper than the text it was parsed from.
    :class:`MatchAll` prints as the empty filter; it is only meaningful at the top.
    """
    if isinstance(expr, MatchAll):
        return ""
    if isinstance(expr, Compare):
        return f"{expr.name} {expr.op.value} {format_literal(expr.value)}"
    if isinstance(expr, Exists):
        return f"exists({expr.name})"
    if isinstance(expr, Prefix):
        return f"prefix({expr.name}, {_quote(expr.text)})"
    if isinstance(expr, Not):
        inner = format_filter(expr.operand)
        return f"not ({inner})" if isinstance(expr.operand, And | Or) else f"not {inner}"
    if isinstance(expr, And):
        return " and ".join(
            f"({format_filter(o)})" if isinstance(o, Or) else format_filter(o)
            for o in expr.operands
        )
    return " or ".join(format_filter(o) for o in expr.operands)


# ---------------------------------------------------------------------------------------
# Compilation
# ---------------------------------------------------------------------------------------


def value_kind(value: object) -> str:
    """``bool``, ``number``, ``string`` (the filter language's kinds) or ``other``."""
    # bool before int: bool is a subclass of int in Python but a distinct kind here.
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "other"


def _compare_pred(name: str, op: CmpOp, literal: Literal) -> Predicate:
    want = value_kind(literal)

    def pred(attrs: Attrs) -> bool:
        if name not in attrs:
            return False
        value = attrs[name]
        if value_kind(value) != want:
            return op is CmpOp.NE
        if op is CmpOp.EQ:
            return value == literal
        if op is CmpOp.NE:
            return value != literal
        if want == "bool":
            return False  # booleans are not ordered
        # Same kind (two numbers or two strings), so the ordering is well defined.
        if op is CmpOp.LT:
            return value < literal  # type: ignore[operator]
        if op is CmpOp.LE:
            return value <= literal  # type: ignore[operator]
        if op is CmpOp.GT:
            return value > literal  # type: ignore[operator]
        return value >= literal  # type: ignore[operator]

    return pred


def compile_expr(expr: Expr) -> Predicate:
    """Compile an AST into a predicate over an attribute mapping; never raises at match."""
    if isinstance(expr, MatchAll):
        return _always
    if isinstance(expr, Compare):
        return _compare_pred(expr.name, expr.op, expr.value)
    if isinstance(expr, Exists):
        name = expr.name
        return lambda attrs: name in attrs
    if isinstance(expr, Prefix):
        pname, text = expr.name, expr.text

        def prefix(attrs: Attrs) -> bool:
            value = attrs.get(pname)
            return isinstance(value, str) and value.startswith(text)

        return prefix
    if isinstance(expr, Not):
        inner = compile_expr(expr.operand)
        return lambda attrs: not inner(attrs)
    preds = tuple(compile_expr(o) for o in expr.operands)
    if isinstance(expr, And):
        return lambda attrs: all(p(attrs) for p in preds)
    return lambda attrs: any(p(attrs) for p in preds)


@dataclass(frozen=True, slots=True)
class Filter:
    """A parsed and compiled filter; call it with a notification's attributes."""

    text: str
    expr: Expr
    predicate: Predicate = field(repr=False, compare=False)

    def __call__(self, attrs: Attrs) -> bool:
        return self.predicate(attrs)


def _always(attrs: Attrs) -> bool:
    return True


@functools.lru_cache(maxsize=COMPILED_CACHE)
def compile_filter(text: str) -> Filter:
    """Parse and compile filter text once; raises :class:`FilterError` if it does not parse."""
    expr = parse_filter(text)
    return Filter(text=text, expr=expr, predicate=compile_expr(expr))
