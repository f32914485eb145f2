"""Flink's ``DATE_FORMAT``, written as Spark's ``date_format`` with a checked pattern.

Flink formats a TIMESTAMP with java.time's ``DateTimeFormatter`` (``DateTimeUtils.formatTimestamp``,
a local date-time: no time zone), and a STRING, first parsed as ``yyyy-MM-dd HH:mm:ss`` in
UTC (leniently: ``2026-02-30`` is March 2nd; NULL where it does not parse), with
``SimpleDateFormat``, whose letters differ. Spark's ``date_format`` takes DateTimeFormatter's
letters but refuses some. So a pattern written as a literal is translated, or refused with
the letter named, before Spark starts. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from sqlglot import exp

from keyflow.sql.templates import call, spark

# quoted text, a lone quote (an error), a run of one letter, any other character
_TOKENS = re.compile(r"'(?:[^']|'')*'|'|([A-Za-z])\1*|.", re.DOTALL)
_SAME = "GyMLdDQqEaKkHhmsSF"  # DateTimeFormatter letters Spark's date_format formats alike
_ZONES = "zZXxOVv"
_WEEKS = "YwWec"
_SIMPLE_SAME = "yMLdDHkKhms"  # SimpleDateFormat letters DateTimeFormatter formats alike (up to the caps below)
_SIMPLE_CAPS = {"G": 1, "a": 1, "E": 4, "M": 4, "L": 4}  # SimpleDateFormat takes more letters to mean the same
_WIDEST = {"d": 2, "H": 2, "h": 2, "k": 2, "K": 2, "m": 2, "s": 2, "D": 3}  # DateTimeFormatter's; SimpleDateFormat pads


def timestamp_pattern(pattern: str) -> str:
    """``pattern`` (DateTimeFormatter's) as Spark's date_format formats a TIMESTAMP the way
    Flink does; a ValueError naming a letter Flink fails on or Spark cannot format."""
    out = []
    for token in _tokens(pattern):
        letter = token[0]
        if not letter.isascii() or not letter.isalpha():
            if letter in "#{}":
                raise ValueError(f"{letter!r} is reserved in a DateTimeFormatter pattern (Flink fails on it); quote it")
            out.append(token)
        elif letter == "u":  # the proleptic year: Spark's `y` (which Spark reads as `u` itself)
            out.append("y" * len(token))
        elif letter in _ZONES:
            raise ValueError(
                f"{token!r}: Flink formats a TIMESTAMP as a local date-time, which has no time zone, so its job fails "
                "on a zone letter; drop it, or write the zone as quoted text ('UTC')"
            )
        elif letter in _WEEKS:
            raise ValueError(
                f"{token!r}: week-based fields follow the JVM's locale in Flink, and Spark's date_format formats none; "
                "use WEEK(ts) or DAYOFWEEK(ts) for ISO weeks and days"
            )
        elif letter not in _SAME or len(token) > _WIDEST.get(letter, 9 if letter == "S" else len(token)):
            raise ValueError(f"{token!r} is not a pattern field both Flink's DateTimeFormatter and Spark format")
        else:
            out.append(token)
    return "".join(out)


def string_pattern(pattern: str) -> str:
    """``pattern`` (SimpleDateFormat's, as Flink formats a parsed STRING: in UTC, without
    fractions of a second) in DateTimeFormatter's letters for Spark's date_format; a
    ValueError naming a field keyflow does not format so."""
    out: list[str] = []
    text = ""  # literal text, quoted once where a field follows: adjacent quoted runs would read as one
    for token in _tokens(pattern):
        letter, count = token[0], len(token)
        if letter == "'":
            text += _unquoted(token)
        elif not letter.isascii() or not letter.isalpha():
            text += token  # SimpleDateFormat prints [ ] { } # as they are; DateTimeFormatter would not
        elif letter == "S":  # milliseconds, always 0 here: the parse reads whole seconds
            text += "0" * count
        elif letter in "zZ" or (letter == "X" and count <= 3):  # the zone is UTC
            text += {"z": "UTC" if count < 4 else "Coordinated Universal Time", "Z": "+0000"}.get(letter, "Z")
        elif (letter in _SIMPLE_SAME or letter in _SIMPLE_CAPS) and count <= _WIDEST.get(letter, count):
            out += [_quoted(text)] if text else []
            out.append(letter * min(count, _SIMPLE_CAPS.get(letter, count)))
            text = ""
        else:
            raise ValueError(
                f"{token!r} is not a SimpleDateFormat field keyflow formats (Flink formats a STRING with "
                "SimpleDateFormat; week-based letters, 'u', 'F', 'XXXX' and numbers padded beyond "
                "DateTimeFormatter's widths, such as 'ddd', are not supported)"
            )
    return "".join(out) + (_quoted(text) if text else "")


def string_timestamp(value: exp.Expr) -> exp.Expr:
    """``value`` (a STRING) read as Flink reads DATE_FORMAT's string: ``y-M-d H:m:s`` at its
    start, fields rolled over as a lenient Calendar does, as a TIMESTAMP_NTZ (a wall clock,
    formatted as is); NULL where it does not parse."""
    # Each field once: a lenient Calendar's roll-over is the year's start plus the months, then
    # the days, then the time (Spark adds an interval's parts in that order); the result is bound
    # once (templates.spark) and kept where its year is 1 to 9999 (fields of at most 6 digits).
    year, month, day, hour, minute, second = (
        f"CAST(nullif(regexp_extract(_s, '{_STRING_PREFIX}', {group}), '') AS INT)" for group in range(1, 7)
    )
    rolled = spark(
        f"make_timestamp_ntz(nullif({year}, 0), 1, 1, 0, 0, 0) "
        f"+ make_interval(0, {month} - 1, 0, {day} - 1, {hour}, {minute}, {second})",
        s=value,
    )
    return spark("CASE WHEN year(_t) BETWEEN 1 AND 9999 THEN _t END", t=rolled)


def formatted(value: exp.Expr, pattern: str) -> exp.Expr:
    return call("date_format", value, exp.Literal.string(pattern))


_STRING_PREFIX = r"^([0-9]{1,4})-([0-9]{1,6})-([0-9]{1,6}) ([0-9]{1,6}):([0-9]{1,6}):([0-9]{1,6})"


def _tokens(pattern: str) -> Iterator[str]:
    """Quoted text, runs of one letter and other characters; a ValueError for an open quote."""
    for match in _TOKENS.finditer(pattern):
        if match.group(0) == "'":
            raise ValueError("a quote opens text it does not close; write a quote itself as ''")
        yield match.group(0)


def _unquoted(token: str) -> str:
    """The text a quoted token stands for (``''`` alone is a quote)."""
    return "'" if token == "''" else token[1:-1].replace("''", "'")


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
