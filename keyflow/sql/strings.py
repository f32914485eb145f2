"""Flink's meaning for string functions whose name Spark shares but whose edge cases it does not.

Each rewrite is Flink's runtime (``SqlFunctionUtils``, ``BinaryStringDataUtil``) case for
case, as Spark SQL; a NULL argument gives NULL throughout, as Flink generates its calls.
docs/sql.md lists each difference. Pure: sqlglot trees in and out.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlglot import exp

from keyflow.sql.errors import SqlError, position
from keyflow.sql.templates import call, spark

LOWER, UPPER = "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _substring(node: exp.Substring) -> exp.Expr:
    """Flink: a negative length is NULL; a negative start before the first character is ''
    (Spark counts the characters from there)."""
    s, start, length = node.this, node.args["start"], node.args.get("length")
    before = "_p < 0 AND char_length(_s) + _p < 0"
    if length is None:
        return spark(f"CASE WHEN {before} THEN '' ELSE substring(_s, _p) END", strict=True, s=s, p=start)
    template = f"CASE WHEN _l < 0 THEN NULL WHEN {before} THEN '' ELSE substring(_s, _p, _l) END"
    return spark(template, strict=True, s=s, p=start, l=length)


def _pad(node: exp.Pad) -> exp.Expr:
    """Flink: a negative length or an empty pad is NULL (Spark: '' and the string)."""
    s, length, pad = node.this, node.expression, node.args.get("fill_pattern")
    if pad is None:
        return node
    function = "lpad" if node.args.get("is_left") else "rpad"
    template = f"CASE WHEN _n < 0 OR _f = '' THEN NULL ELSE {function}(_s, _n, _f) END"
    return spark(template, strict=True, s=s, n=length, f=pad)


def _initcap(node: exp.Initcap) -> exp.Expr:
    """Flink (Calcite's): a word is a run of ASCII letters and digits; its first letter is
    upper-cased, the rest lower-cased, ASCII only (Spark: words between spaces, any letter)."""
    template = (
        "CASE WHEN _s = '' THEN _s ELSE array_join(transform(sequence(1, char_length(_s)), __kf_i -> CASE WHEN "
        "__kf_i = 1 OR NOT substring(_s, __kf_i - 1, 1) RLIKE '[A-Za-z0-9]' THEN translate(substring(_s, __kf_i, 1), "
        f"'{LOWER}', '{UPPER}') ELSE translate(substring(_s, __kf_i, 1), '{UPPER}', '{LOWER}') END), '') END"
    )
    return spark(template, s=node.this)


def _locate(node: exp.StrPosition) -> exp.Expr:
    """Flink's ``LOCATE(needle, s, from)``: a start below 1 searches from the first character
    (Spark: 0, not found)."""
    start = node.args.get("position")
    if start is None:
        return node
    needle, s = node.args["substr"], node.this
    template = "locate(_a, _s, CASE WHEN _p < 1 THEN 1 ELSE _p END)"
    return spark(template, strict=True, a=needle, s=s, p=start)


def _replace(node: exp.Replace) -> exp.Expr:
    """Flink (Java's ``String.replace``): an empty search string puts the replacement before
    every character and at the end (Spark: the string unchanged)."""
    s, search, replacement = node.this, node.expression, node.args["replacement"]
    escaped = _literal_replacement(replacement)
    template = "CASE WHEN _a = '' THEN regexp_replace(_s, '', _e) ELSE replace(_s, _a, _b) END"
    return spark(template, strict=True, s=s, a=search, b=replacement, e=escaped)


def _regexp_replace(node: exp.RegexpReplace) -> exp.Expr:
    """Flink replaces with the text as given (``Matcher.quoteReplacement``); Spark reads ``$1``
    as a group and ``\\`` as an escape."""
    if any(node.args.get(extra) is not None for extra in ("position", "occurrence", "modifiers")):
        return node
    return call("regexp_replace", node.this, node.expression, _literal_replacement(node.args["replacement"]))


def _regexp(node: exp.Anonymous) -> exp.Expr:
    """Flink's ``REGEXP(s, regex)``: whether the regex is found in ``s``; an empty regex is
    FALSE (Spark: TRUE)."""
    s, regex = arguments(node, (2,), "REGEXP(s, regex)")
    return spark("CASE WHEN _r = '' THEN false ELSE _s RLIKE _r END", strict=True, s=s, r=regex)


def _ascii(node: exp.Ascii) -> exp.Expr:
    """Flink: the first UTF-8 byte, signed (``é`` is -61; Spark: the code point, 233)."""
    template = (
        "CASE WHEN ascii(_s) < 128 THEN ascii(_s) "
        "ELSE CAST(conv(substring(hex(encode(_s, 'UTF-8')), 1, 2), 16, 10) AS INT) - 256 END"
    )
    return spark(template, s=node.this)


def _overlay(node: exp.Overlay) -> exp.Expr:
    """Flink: a start outside the string leaves it unchanged, and a length of 0 or less (also
    an empty replacement's own length) drops the rest (Spark appends, or inserts)."""
    s, replacement, start = node.this, node.expression, node.args["from_"]
    length = node.args.get("for_") or exp.Anonymous(this="char_length", expressions=[replacement.copy()])
    template = (
        "CASE WHEN _p <= 0 OR _p > char_length(_s) THEN _s WHEN _l <= 0 THEN concat(substring(_s, 1, _p - 1), _r) "
        "ELSE overlay(_s PLACING _r FROM _p FOR _l) END"
    )
    return spark(template, strict=True, s=s, r=replacement, p=start, l=length)


def _str_to_map(node: exp.Anonymous) -> exp.Expr:
    """Flink's ``STR_TO_MAP(s[, pairs, pair])``: delimiters ``,`` and ``=`` (Spark's default
    pair delimiter is ``:``), both regular expressions; empty entries at the end dropped and
    an empty string an empty map, as Java's ``split`` (Spark: a ``''`` key)."""
    given = arguments(node, (1, 3), "STR_TO_MAP(s) or STR_TO_MAP(s, pair_delimiter, key_value_delimiter)")
    s, pairs, pair = (*given, exp.Literal.string(","), exp.Literal.string("="))[:3]
    # Spark may evaluate a CASE's repeated parts before its conditions: the regex must be valid for '' too
    template = (
        r"CASE WHEN regexp_replace(_s, concat('(?:', CASE WHEN _d = '' THEN '\\z.' ELSE _d END, ')+\\z'), '') = '' "
        r"THEN CAST(map() AS MAP<STRING, STRING>) ELSE str_to_map(regexp_replace(_s, concat('(?:', CASE WHEN _d = '' "
        r"THEN '\\z.' ELSE _d END, ')+\\z'), ''), _d, _k) END"
    )
    return spark(template, strict=True, s=s, d=pairs, k=pair)


def _instr(node: exp.Anonymous) -> exp.Expr:
    """Flink's two-argument ``INSTR`` is Spark's; its start position and occurrence are not."""
    if len(node.expressions) > 2:
        raise SqlError(
            f"INSTR(…) with a start position or occurrence at {position(node)} is not supported; use "
            "INSTR(s, sub), or LOCATE(sub, s, start)"
        )
    return call("instr", *arguments(node, (2,), "INSTR(s, sub)"))


def arguments(node: exp.Anonymous, counts: tuple[int, ...], form: str) -> list[exp.Expr]:
    """The call's arguments, or a SqlError naming the form Flink takes."""
    if len(node.expressions) not in counts:
        given = len(node.expressions)
        raise SqlError(f"{node.name.upper()}(…) at {position(node)} has {given} argument(s); write {form}")
    return list(node.expressions)


def _literal_replacement(replacement: exp.Expr) -> exp.Expr:
    """``replacement`` with ``\\`` and ``$`` escaped, so a regex replacement inserts it as given."""
    return call("regexp_replace", replacement.copy(), exp.Literal.string(r"([\\$])"), exp.Literal.string(r"\\$1"))


def _split_index(node: exp.Anonymous) -> exp.Expr:
    """Flink's ``SPLIT_INDEX(s, separator, i)``: the i-th (from 0) piece of ``s`` split at the
    literal ``separator`` (an empty one: at each whitespace character, as commons-lang's
    ``splitByWholeSeparatorPreserveAllTokens``; a number: the character of that code, 1 to
    255); NULL where there is none, also for an empty ``s`` (Spark has no such function)."""
    s, separator, index = arguments(node, (3,), "SPLIT_INDEX(s, separator, index)")
    if isinstance(separator, exp.Literal) and not separator.is_string:
        code = separator
        separator = spark("CASE WHEN _c BETWEEN 1 AND 255 THEN chr(_c) END", c=code)
    template = (  # the separator quoted as Java's Pattern.quote does, \E inside it too
        r"CASE WHEN _i >= 0 AND _s != '' THEN try_element_at(split(_s, CASE WHEN _d = '' THEN "
        r"'\\p{javaWhitespace}' ELSE concat('\\Q', replace(_d, '\\E', '\\E\\\\E\\Q'), '\\E') END, -1), _i + 1) END"
    )
    return spark(template, strict=True, s=s, d=separator, i=index)


def _is_digit(node: exp.Anonymous) -> exp.Expr:
    """Flink's ``IS_DIGIT(s)``: every character a digit (Java's ``Character.isDigit``), not
    empty; FALSE for NULL."""
    (s,) = arguments(node, (1,), "IS_DIGIT(s)")
    return spark(r"coalesce(_s RLIKE '^\\p{Nd}+\\z', false)", s=s)


def _is_alpha(node: exp.Anonymous) -> exp.Expr:
    """Flink's ``IS_ALPHA(s)``: every character a letter (``Character.isLetter``), not empty;
    FALSE for NULL."""
    (s,) = arguments(node, (1,), "IS_ALPHA(s)")
    return spark(r"coalesce(_s RLIKE '^\\p{L}+\\z', false)", s=s)


def _from_base64(node: exp.FromBase64) -> exp.Expr:
    """Flink's ``FROM_BASE64`` is a string (Spark's ``unbase64``: bytes)."""
    return spark("decode(unbase64(_s), 'UTF-8')", s=node.this)


BY_CLASS: dict[type[exp.Expr], Callable[[Any], exp.Expr]] = {
    exp.Substring: _substring,
    exp.Pad: _pad,
    exp.Initcap: _initcap,
    exp.StrPosition: _locate,
    exp.Replace: _replace,
    exp.RegexpReplace: _regexp_replace,
    exp.Ascii: _ascii,
    exp.Overlay: _overlay,
    exp.FromBase64: _from_base64,
}
BY_NAME: dict[str, Callable[[Any], exp.Expr]] = {
    "REGEXP": _regexp,
    "SPLIT_INDEX": _split_index,
    "STR_TO_MAP": _str_to_map,
    "INSTR": _instr,
    "IS_DIGIT": _is_digit,
    "IS_ALPHA": _is_alpha,
}
# Parsed as plain calls (sqlglot's nodes would fill in Spark's defaults or merge them with LOCATE).
RAW_CALLS = ("STR_TO_MAP", "INSTR")
