"""The filter language: parsing, semantics, error positions, limits and properties."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mdeci.errors import FilterError, MdeciError
from mdeci.filter_types import FilterTypeError, check_types, kinds_seen
from mdeci.filters import (
    MAX_DEPTH,
    MAX_FILTER_LENGTH,
    And,
    CmpOp,
    Compare,
    Exists,
    Expr,
    MatchAll,
    Not,
    Or,
    Prefix,
    compile_expr,
    compile_filter,
    format_filter,
    format_literal,
    parse_filter,
)


def matches(text: str, attrs: dict[str, Any]) -> bool:
    return compile_filter(text)(attrs)


# ---------------------------------------------------------------------------------------
# The example and the AST
# ---------------------------------------------------------------------------------------


def test_protocol_example() -> None:
    f = compile_filter("(Stock == 'PETR4') and (Price < 25)")
    assert f.expr == And(
        (Compare("Stock", CmpOp.EQ, "PETR4"), Compare("Price", CmpOp.LT, 25)),
    )
    assert f({"Stock": "PETR4", "Price": 24.5})
    assert not f({"Stock": "PETR4", "Price": 25})
    assert not f({"Stock": "VALE3", "Price": 10})
    assert not f({"Stock": "PETR4"})  # missing Price: the comparison is false
    assert f.text == "(Stock == 'PETR4') and (Price < 25)"


@pytest.mark.parametrize("text", ["", "   ", "\t\n "])
def test_empty_filter_matches_everything(text: str) -> None:
    assert parse_filter(text) == MatchAll()
    assert matches(text, {})
    assert matches(text, {"a": 1})
    assert format_filter(MatchAll()) == ""


def test_precedence_not_over_and_over_or() -> None:
    a, b, c = (Compare(n, CmpOp.EQ, 1) for n in "abc")
    assert parse_filter("a == 1 or b == 1 and c == 1") == Or((a, And((b, c))))
    assert parse_filter("a == 1 and b == 1 or c == 1") == Or((And((a, b)), c))
    assert parse_filter("not a == 1 and b == 1") == And((Not(a), b))
    assert parse_filter("not a == 1 or b == 1") == Or((Not(a), b))
    assert parse_filter("not (a == 1 or b == 1)") == Not(Or((a, b)))
    assert parse_filter("(a == 1 or b == 1) and c == 1") == And((Or((a, b)), c))
    assert parse_filter("not not a == 1") == Not(Not(a))


def test_chains_are_flattened() -> None:
    a, b, c = (Compare(n, CmpOp.EQ, 1) for n in "abc")
    assert parse_filter("(a == 1 and b == 1) and c == 1") == And((a, b, c))
    assert parse_filter("a == 1 or (b == 1 or c == 1)") == Or((a, b, c))


def test_literals() -> None:
    def lit(text: str) -> object:
        expr = parse_filter(f"x == {text}")
        assert isinstance(expr, Compare)
        return expr.value

    assert lit("42") == 42 and isinstance(lit("42"), int)
    assert lit("-7") == -7
    assert lit("0") == 0
    assert lit("2.5") == 2.5 and isinstance(lit("2.5"), float)
    assert lit("-0.25") == -0.25
    assert lit("1e3") == 1000.0 and isinstance(lit("1e3"), float)
    assert lit("1.5E-2") == 0.015
    assert lit("2e+2") == 200.0
    assert lit("true") is True
    assert lit("false") is False
    assert lit("'PETR4'") == "PETR4"
    assert lit('"PETR4"') == "PETR4"
    assert lit("''") == ""
    assert lit(r"'it\'s'") == "it's"
    assert lit(r'"say \"hi\""') == 'say "hi"'
    assert lit(r"'a\\b'") == "a\\b"
    assert lit(r"'\n\t\r\0'") == "\n\t\r\0"
    assert lit(r"'\u00e9\u20AC'") == "é€"
    assert lit("'\"'") == '"'
    assert lit('"\'"') == "'"
    assert lit("'ünïcödé'") == "ünïcödé"
    assert lit(str(2**63 - 1)) == 2**63 - 1
    assert lit(str(-(2**63))) == -(2**63)


def test_whitespace_is_optional() -> None:
    assert parse_filter("(a==1)and(b<=2)") == And(
        (Compare("a", CmpOp.EQ, 1), Compare("b", CmpOp.LE, 2))
    )
    assert parse_filter("x>-1") == Compare("x", CmpOp.GT, -1)
    assert parse_filter("exists( a )") == Exists("a")
    assert parse_filter("prefix(a,'x')") == Prefix("a", "x")


# ---------------------------------------------------------------------------------------
# Semantics
# ---------------------------------------------------------------------------------------

ATTRS = {"i": 5, "f": 2.5, "s": "mango", "t": True, "z": False, "e": ""}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # numbers (int and float compare numerically)
        ("i == 5", True),
        ("i == 5.0", True),
        ("i != 5", False),
        ("i != 4", True),
        ("i < 6", True),
        ("i < 5", False),
        ("i <= 5", True),
        ("i > 4.5", True),
        ("i > 5", False),
        ("i >= 5", True),
        ("f < 3", True),
        ("f >= 2.5", True),
        ("f == 2.5", True),
        ("i > -10", True),
        # strings (code point order)
        ("s == 'mango'", True),
        ('s == "mango"', True),
        ("s != 'kiwi'", True),
        ("s < 'zebra'", True),
        ("s <= 'mango'", True),
        ("s > 'apple'", True),
        ("s >= 'mangoes'", False),
        ("s < 'Zebra'", False),  # 'Z' < 'm' in code points
        ("e == ''", True),
        # booleans: distinct from numbers, not ordered
        ("t == true", True),
        ("t != false", True),
        ("z == false", True),
        ("t == 1", False),
        ("t != 1", True),
        ("i == true", False),
        ("t > false", False),
        ("t >= true", False),
        # mixed kinds: no coercion
        ("s == 5", False),
        ("s != 5", True),
        ("s < 5", False),
        ("s >= 5", False),
        ("i == '5'", False),
        ("i != '5'", True),
        ("i < '6'", False),
        # missing attributes: every comparison is false
        ("nope == 1", False),
        ("nope != 1", False),
        ("nope < 1", False),
        ("nope >= 'a'", False),
        ("not (nope == 1)", True),
        ("not nope != 1", True),
        # exists and prefix
        ("exists(i)", True),
        ("exists(z)", True),  # present even though false
        ("exists(e)", True),
        ("exists(nope)", False),
        ("prefix(s, 'man')", True),
        ("prefix(s, '')", True),
        ("prefix(s, 'mango!')", False),
        ("prefix(i, '5')", False),  # not a string
        ("prefix(nope, '')", False),
        # logic
        ("i == 5 and s == 'mango'", True),
        ("i == 5 and s == 'kiwi'", False),
        ("i == 4 or s == 'mango'", True),
        ("i == 4 or s == 'kiwi'", False),
        ("not i == 4", True),
        ("not (i == 5 and t == true)", False),
        ("i == 4 or i == 3 or i == 5", True),
        ("(i == 4 or i == 5) and not exists(nope)", True),
    ],
)
def test_semantics(text: str, expected: bool) -> None:
    assert matches(text, ATTRS) is expected


def test_predicate_never_raises_on_odd_values() -> None:
    f = compile_filter("x < 1 or x == 'a' or prefix(x, 'a') or x != true")
    for value in (float("nan"), float("inf"), -0.0, "", True, 2**80, [1], None):
        assert isinstance(f({"x": value}), bool)  # type: ignore[dict-item]


def test_compile_expr_from_ast() -> None:
    pred = compile_expr(Or((Exists("a"), Not(Prefix("b", "x")))))
    assert pred({"a": 1, "b": "xyz"})
    assert pred({"b": "yz"})
    assert not pred({"b": "xz"})


def test_filter_is_hashable_and_comparable_by_text_and_ast() -> None:
    assert compile_filter("a == 1") == compile_filter("a == 1")
    assert compile_filter("a == 1") != compile_filter("a==1")  # text differs
    assert compile_filter("a==1").expr == compile_filter("a == 1").expr
    assert hash(compile_filter("a == 1")) == hash(compile_filter("a == 1"))


# ---------------------------------------------------------------------------------------
# Errors: every one with its position
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "position", "fragment"),
    [
        ("(Stock == 'PETR4'", 17, "expected ')', found end of filter"),
        ("a == 1)", 6, "expected 'and', 'or' or end of filter, found ')'"),
        ("a == 1 b == 2", 7, "expected 'and', 'or' or end of filter, found 'b'"),
        ("a", 1, "expected a comparison operator after 'a', found end of filter"),
        ("a 1", 2, "expected a comparison operator after 'a'"),
        ("a ==", 4, "expected a string, number, 'true' or 'false', found end of filter"),
        ("a == b", 5, "expected a string, number, 'true' or 'false', found 'b'"),
        ("a == and", 5, "found 'and'"),
        ("a = 1", 2, "unexpected character '='; did you mean '=='?"),
        ("a ! 1", 2, "unexpected character '!'"),
        ("a =! 1", 2, "unexpected character '='"),
        ("a == 1 && b == 2", 7, "unexpected character '&'"),
        ("a == $", 5, "unexpected character '$'"),
        ("é == 1", 0, "unexpected character 'é'"),
        ("a == 'abc", 5, "unterminated string"),
        ('a == "abc\\"', 5, "unterminated string"),
        ("a == 'ab\\", 5, "unterminated string"),
        ("a == 'a\\qb'", 7, "invalid escape '\\q'"),
        ("a == '\\u12'", 6, "\\u needs four hex digits"),
        ("a == '\\u12zz'", 6, "\\u needs four hex digits"),
        ("a == '\\ud800'", 6, "surrogate"),
        ("a == -", 6, "expected a digit after '-'"),
        ("a == -x", 6, "expected a digit after '-'"),
        ("a == 1.", 7, "expected a digit after '.'"),
        ("a == 1.x", 7, "expected a digit after '.'"),
        ("a == 1e", 7, "expected a digit after 'e'"),
        ("a == 1e+", 8, "expected a digit after '+'"),
        ("a == 1x", 6, "unexpected character 'x' after a number"),
        ("a == 1.2.3", 8, "unexpected character '.' after a number"),
        ("a == 1e999", 5, "number out of range"),
        ("a == 9223372036854775808", 5, "integer out of range"),
        ("a == -9223372036854775809", 5, "integer out of range"),
        ("a == " + "9" * 5000, MAX_FILTER_LENGTH, "longer than 4096"),
        ("and == 1", 0, "expected an attribute name, 'not', 'exists', 'prefix' or '('"),
        ("true", 0, "found 'true'"),
        ("()", 1, "found ')'"),
        ("a == 1 and", 10, "found end of filter"),
        ("a == 1 or or b == 1", 10, "found 'or'"),
        ("not", 3, "found end of filter"),
        ("exists a", 7, "expected '(', found 'a'"),
        ("exists()", 7, "expected an attribute name, found ')'"),
        ("exists(a", 8, "expected ')', found end of filter"),
        ("exists(1)", 7, "expected an attribute name, found '1'"),
        ("prefix(a)", 8, "expected ',', found ')'"),
        ("prefix(a, 1)", 10, "expected a quoted string, found '1'"),
        ("prefix(a, b)", 10, "expected a quoted string, found 'b'"),
        ("prefix(a, 'x'", 13, "expected ')'"),
        ("prefix('a', 'x')", 7, "expected an attribute name, found \"'a'\""),
        ("a" * 65 + " == 1", 0, "attribute name longer than 64"),
        ("1 == a", 0, "expected an attribute name"),
        ("a == 1,", 6, "found ','"),
    ],
)
def test_error_positions(text: str, position: int, fragment: str) -> None:
    with pytest.raises(FilterError) as info:
        parse_filter(text)
    exc = info.value
    assert exc.position == position, str(exc)
    assert fragment in exc.reason, str(exc)
    assert str(exc) == f"position {position}: {exc.reason}"
    assert "\n" not in str(exc)
    assert isinstance(exc, MdeciError)


def test_error_message_format() -> None:
    with pytest.raises(FilterError, match=r"^position 17: expected '\)', found end of filter$"):
        parse_filter("(Stock == 'PETR4'")


def test_long_tokens_are_shortened_in_messages() -> None:
    with pytest.raises(FilterError) as info:
        parse_filter("a == 1 '" + "x" * 100 + "'")
    assert len(str(info.value)) < 100


# ---------------------------------------------------------------------------------------
# Limits
# ---------------------------------------------------------------------------------------


def test_length_limit() -> None:
    ok = "a == 1" + " " * (MAX_FILTER_LENGTH - 6)
    assert parse_filter(ok) == Compare("a", CmpOp.EQ, 1)
    with pytest.raises(FilterError, match="longer than"):
        parse_filter(ok + " ")


def test_depth_limit_parentheses() -> None:
    ok = "(" * MAX_DEPTH + "a == 1" + ")" * MAX_DEPTH
    assert parse_filter(ok) == Compare("a", CmpOp.EQ, 1)
    deep = "(" * (MAX_DEPTH + 1) + "a == 1" + ")" * (MAX_DEPTH + 1)
    with pytest.raises(FilterError) as info:
        parse_filter(deep)
    assert info.value.position == MAX_DEPTH
    assert "deeper than" in info.value.reason


def test_depth_limit_not() -> None:
    assert isinstance(parse_filter("not " * MAX_DEPTH + "a == 1"), Not)
    with pytest.raises(FilterError) as info:
        parse_filter("not " * (MAX_DEPTH + 1) + "a == 1")
    assert info.value.position == 4 * MAX_DEPTH


def test_hostile_nesting_within_length_is_refused_quickly() -> None:
    for text in ("(" * 4000, "not " * 1000, "(" * 2000 + ")" * 2000):
        with pytest.raises(FilterError):
            parse_filter(text)


def test_long_flat_chains_are_fine() -> None:
    text = " or ".join(f"a=={i}" for i in range(400))
    assert len(text) <= MAX_FILTER_LENGTH
    f = compile_filter(text)
    assert f({"a": 399})
    assert not f({"a": 400})


# ---------------------------------------------------------------------------------------
# Printing
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (True, "true"),
        (False, "false"),
        (3, "3"),
        (-3, "-3"),
        (2.5, "2.5"),
        (1e16, "1e+16"),
        ("it's", r"'it\'s'"),
        ("a\\b", r"'a\\b'"),
        ("l1\nl2\t\r", r"'l1\nl2\t\r'"),
        ("\x00\x7f", r"'\u0000\u007f'"),
        ('"', "'\"'"),
    ],
)
def test_format_literal(value: Any, text: str) -> None:
    assert format_literal(value) == text
    expr = parse_filter(f"x == {text}")
    assert isinstance(expr, Compare)
    assert expr.value == value
    assert type(expr.value) is type(value)


def test_format_filter_minimal_parentheses() -> None:
    text = "a == 1 or b == 'x' and not c != 2"
    assert format_filter(parse_filter(text)) == text
    assert format_filter(parse_filter("(a == 1 or b == 2) and c == 3")) == (
        "(a == 1 or b == 2) and c == 3"
    )
    assert format_filter(parse_filter("not (a == 1 and b == 2)")) == "not (a == 1 and b == 2)"
    assert format_filter(parse_filter("((a == 1))")) == "a == 1"
    assert format_filter(parse_filter("prefix(a, 'b') or exists(c)")) == (
        "prefix(a, 'b') or exists(c)"
    )


# ---------------------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------------------


@settings(max_examples=400, deadline=None)
@given(st.text(max_size=60))
def test_random_text_gives_a_filter_or_filter_error(text: str) -> None:
    try:
        f = compile_filter(text)
    except FilterError as exc:
        assert 0 <= exc.position <= len(text)
    else:
        assert isinstance(f({"a": 1}), bool)


FILTER_ALPHABET = st.sampled_from(
    [
        *"abx ()'\"\\.-019e=!<>,",
        *("and ", "or ", "not ", "true", "false", "exists", "prefix", " == ", " < "),
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(FILTER_ALPHABET, max_size=25).map("".join))
def test_filter_like_text_gives_a_filter_or_filter_error(text: str) -> None:
    """Text built from the language's own tokens reaches deep into the parser."""
    try:
        expr = parse_filter(text)
    except FilterError as exc:
        assert 0 <= exc.position <= len(text)
    else:
        assert parse_filter(format_filter(expr)) == expr


NAMES = ["a", "b", "c"]
literals = st.one_of(
    st.integers(-3, 3),
    st.sampled_from([0.5, -1.0, 2.0, 1e20]),
    st.sampled_from(["", "a", "ab", "b", "it's", 'q"', "\\", "é\n"]),
    st.booleans(),
)


def exprs(depth: int) -> st.SearchStrategy[Expr]:
    leaves: st.SearchStrategy[Expr] = st.one_of(
        st.builds(Compare, st.sampled_from(NAMES), st.sampled_from(list(CmpOp)), literals),
        st.builds(Exists, st.sampled_from(NAMES)),
        st.builds(Prefix, st.sampled_from(NAMES), st.sampled_from(["", "a", "'", "é"])),
    )
    if depth == 0:
        return leaves
    sub = exprs(depth - 1)
    return st.one_of(
        leaves,
        st.builds(Not, sub),
        st.builds(And, st.lists(sub, min_size=2, max_size=3).map(tuple)),
        st.builds(Or, st.lists(sub, min_size=2, max_size=3).map(tuple)),
    )


attr_maps = st.dictionaries(st.sampled_from(NAMES), literals, max_size=3)


@settings(max_examples=300, deadline=None)
@given(exprs(4), st.lists(attr_maps, min_size=1, max_size=8))
def test_printed_asts_reparse_to_the_same_evaluation(
    expr: Expr, samples: list[dict[str, Any]]
) -> None:
    text = format_filter(expr)
    reparsed = parse_filter(text)
    original, again = compile_expr(expr), compile_expr(reparsed)
    for attrs in samples:
        assert original(attrs) == again(attrs), (text, attrs)
    # printing is a fixed point after one parse (flattening is the only normalisation)
    assert format_filter(reparsed) == text
    assert parse_filter(format_filter(reparsed)) == reparsed


def test_check_types_refuses_a_number_attribute_compared_with_a_string() -> None:
    kinds = kinds_seen([{"Price": 24.5, "Stock": "PETR4"}, {"Price": 3, "Up": True}])
    assert kinds == {"Price": "number", "Stock": "string", "Up": "bool"}
    with pytest.raises(FilterTypeError) as info:
        check_types(parse_filter("Stock == 'PETR4' and not (Price < 'abc')"), kinds)
    assert str(info.value) == (
        "Price is a number, so 'Price < 'abc'' compares it with a string and is never true"
    )
    assert isinstance(info.value, FilterError)
    with pytest.raises(FilterTypeError, match="Up is a bool"):
        check_types(parse_filter("Up > false"), kinds)
    with pytest.raises(FilterTypeError, match="Stock is a string"):
        check_types(parse_filter("Stock == 1"), kinds)
    # Between kinds != holds for every notification, which the message says as it is.
    with pytest.raises(FilterTypeError, match=r"with a string and is always true$"):
        check_types(parse_filter("Price != 'abc'"), kinds)
    assert compile_filter("Price != 'abc'")({"Price": 24.5}) is True
    check_types(parse_filter("Price < 25 and Stock < 'Q' and Other < 'x' and Up == true"), kinds)
    # An attribute seen with two kinds has none: nothing to hold a filter against.
    assert kinds_seen([{"x": 1}, {"x": "1"}]) == {}
    # The language itself still accepts it (matching never raises): false, not an error.
    assert compile_filter("Price < 'abc'")({"Price": 24.5}) is False
