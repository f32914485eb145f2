"""Flink's meanings of string and date functions Spark shares by name (docs/sql.md "Flink's
meanings"): a SQL job over edge-case rows (NULLs, empty strings, negative and out-of-range
positions, non-ASCII text) equals plain Python written from Flink's runtime code
(``SqlFunctionUtils``, ``BinaryStringDataUtil``, ``DateTimeUtils``), row for row."""

from __future__ import annotations

import base64
import re
import unicodedata
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from keyflow import Pipeline
from keyflow.sql.errors import SqlError
from tests.pipelines import TEST_SPARK
from tests.streams import read_output

ROWS = [  # s, a (a needle, separator or pattern), b (a replacement), p, l, ts, d (a date-time string)
    ("hello-wORLD x1y", "o", "$1\\", 2, 3, datetime(2026, 3, 1, 14, 5, 9, 123456), "2026-03-01 12:34:56"),
    ("abcdefg", "", "x", 0, 0, datetime(2026, 12, 31, 0, 0, 0), "2026-02-30 25:61:00.5"),
    ("abc", "c", "", -1, -1, datetime(1999, 1, 4, 23, 59, 59, 999000), "2026-3-1 1:2:3"),
    ("abc", "z", "yy", -5, 2, datetime(2026, 7, 15, 12, 0, 0), "2026-13-01 00:00:00"),
    ("", "a", "r", 5, 10, datetime(2026, 1, 1, 0, 30, 0), "2026-03-01"),
    ("élan 2nd_wave", "an", "ó", 1, 4, datetime(2026, 6, 1, 6, 7, 8), "not a date"),
    ("a=1,b=2,,", ",", "=", 3, 0, datetime(2026, 2, 28, 1, 0, 0), "0999-01-01 00:00:00"),
    ("k1:v1;k2", ";", ":", 10, 1, datetime(2026, 11, 11, 11, 11, 11), "2026-01-00 00:00:00"),
    ("a  b\tc", "", "-", 2, 2, datetime(2026, 5, 5, 5, 5, 5), "2026-05-05 05:05:05"),
    ("١٢٣", "٢", "x", 2, 1, datetime(2026, 4, 4, 4, 4, 4), "2026-04-04 04:04:04"),
    ("aGVsbG8=", "l+", "L", 4, 5, datetime(2026, 8, 8, 8, 8, 8), "2026-08-08 08:08:08"),
    (None, "a", "b", 1, 1, None, None),
    ("abc", None, None, None, None, datetime(2026, 1, 1), "2026-01-01 00:00:00"),
]
SCHEMA = pa.schema(
    [("s", pa.string()), ("a", pa.string()), ("b", pa.string()), ("p", pa.int32()), ("l", pa.int32()),
     ("ts", pa.timestamp("us")), ("d", pa.string())]
)  # fmt: skip


def _nulls(function: Callable[..., Any]) -> Callable[..., Any]:
    """Flink generates its string functions' calls so that any NULL argument gives NULL."""
    return lambda *arguments: None if any(a is None for a in arguments) else function(*arguments)


@_nulls
def substring(s: str, p: int, length: int | None = None) -> str | None:  # BinaryStringDataUtil.substringSQL
    if length is not None and length < 0:
        return None
    if s == "":
        return ""
    if p > 0:
        start = p - 1
        if start >= len(s):
            return ""
    elif p < 0:
        start = len(s) + p
        if start < 0:
            return ""
    else:
        start = 0
    end = len(s) if length is None or len(s) - start < length else start + length
    return s[start:end]


def pad(left: bool) -> Callable[..., Any]:
    @_nulls
    def padded(s: str, n: int, filler: str) -> str | None:  # SqlFunctionUtils.lpad / rpad
        if n < 0 or filler == "":
            return None
        if n <= len(s):
            return s[:n]
        fill = (filler * n)[: n - len(s)]
        return fill + s if left else s + fill

    return padded


@_nulls
def initcap(s: str) -> str:  # Calcite's SqlFunctions.initcap, which Flink calls
    out, start = [], True
    for char in s:
        code = ord(char)
        word = 48 <= code <= 57 or 65 <= code <= 90 or 97 <= code <= 122
        if start and word:
            char = char.upper() if 97 <= code <= 122 else char
            start = False
        elif not start:
            if 65 <= code <= 90:
                char = char.lower()
            elif not word:
                start = True
        out.append(char)
    return "".join(out)


@_nulls
def locate(needle: str, s: str, start: int) -> int:  # SqlFunctionUtils.position: indexOf(seek, from - 1) + 1
    return 1 if needle == "" else s.find(needle, max(start - 1, 0)) + 1


@_nulls
def overlay(s: str, r: str, start: int, length: int | None = None) -> str:  # SqlFunctionUtils.overlay
    length = len(r) if length is None else length
    if start <= 0 or start > len(s):
        return s
    out = s[: start - 1] + r
    return out + s[start - 1 + length :] if start + length <= len(s) and length > 0 else out


@_nulls
def ascii_code(s: str) -> int:  # BinaryStringData: the first UTF-8 byte, signed
    return 0 if s == "" else (s.encode()[0] ^ 0x80) - 0x80


@_nulls
def str_to_map(s: str, pairs: str = ",", pair: str = "=") -> list[tuple[str, str | None]]:
    if s == "":
        return []
    parts = re.split(pairs, s)
    while parts and parts[-1] == "":  # Java's String.split drops trailing empty strings
        parts.pop()
    entries = {}
    for part in parts:
        key, *value = re.split(pair, part, maxsplit=1)
        entries[key] = value[0] if value else None
    return sorted(entries.items())


@_nulls
def split_index(s: str, separator: str, index: int) -> str | None:  # splitByWholeSeparatorPreserveAllTokens
    if index < 0 or s == "":
        return None
    pieces = s.split(separator) if separator else re.split(r"[ \t\n\x0b\f\r\x1c-\x1f]", s)
    return pieces[index] if index < len(pieces) else None


def every(category: str) -> Callable[[str | None], bool]:
    """IS_DIGIT / IS_ALPHA: commons-lang's isNumeric / isAlpha (Character.isDigit / isLetter)."""
    return lambda s: bool(s) and all(unicodedata.category(c).startswith(category) for c in s)


def lenient(d: str | None) -> datetime | None:
    """SimpleDateFormat('yyyy-MM-dd HH:mm:ss') lenient: fields roll over; NULL where it fails."""
    match = re.match(r"(\d+)-(\d+)-(\d+) (\d+):(\d+):(\d+)", d or "")
    if match is None:
        return None
    year, month, day, hour, minute, second = map(int, match.groups())
    first = datetime(year + (month - 1) // 12, (month - 1) % 12 + 1, 1)
    return first + timedelta(days=day - 1, hours=hour, minutes=minute, seconds=second)


def _on_datetime(function: Callable[[datetime], str]) -> Callable[[datetime | None], str | None]:
    return lambda value: None if value is None else function(value)


COLUMNS: dict[str, tuple[str, Callable[[tuple[Any, ...]], Any]]] = {
    "substring3": ("SUBSTRING(s FROM p FOR l)", lambda r: substring(r[0], r[3], r[4])),
    "substring2": ("SUBSTR(s, p)", lambda r: substring(r[0], r[3])),
    "lpad": ("LPAD(s, l, b)", lambda r: pad(True)(r[0], r[4], r[2])),
    "rpad": ("RPAD(s, p, b)", lambda r: pad(False)(r[0], r[3], r[2])),
    "initcap": ("INITCAP(s)", lambda r: initcap(r[0])),
    "locate": ("LOCATE(a, s, p)", lambda r: locate(r[1], r[0], r[3])),
    "replace": ("REPLACE(s, a, b)", lambda r: _nulls(str.replace)(r[0], r[1], r[2])),
    "regexp_replace": (  # Java's replaceAll with Matcher.quoteReplacement: the replacement as given
        "REGEXP_REPLACE(s, 'l+|b', b)",
        lambda r: _nulls(lambda s, b: re.sub("l+|b", lambda _: b, s))(r[0], r[2]),
    ),
    "regexp": ("REGEXP(s, a)", lambda r: _nulls(lambda s, a: a != "" and re.search(a, s) is not None)(r[0], r[1])),
    "ascii": ("ASCII(s)", lambda r: ascii_code(r[0])),
    "overlay4": ("OVERLAY(s PLACING b FROM p FOR l)", lambda r: overlay(r[0], r[2], r[3], r[4])),
    "overlay3": ("OVERLAY(s PLACING b FROM p)", lambda r: overlay(r[0], r[2], r[3])),
    "str_to_map2": ("STR_TO_MAP(s)", lambda r: str_to_map(r[0])),
    "str_to_map": (  # an empty delimiter is left out: Java's split("") and Python's differ at the start
        "CASE WHEN a <> '' THEN STR_TO_MAP(s, a, ':') END",
        lambda r: str_to_map(r[0], r[1], ":") if r[1] != "" else None,
    ),
    "split_index": ("SPLIT_INDEX(s, a, 1)", lambda r: split_index(r[0], r[1], 1)),
    "split_code": ("SPLIT_INDEX(s, 44, 1)", lambda r: split_index(r[0], ",", 1)),  # 44 is ','
    "initcap_nested": ("INITCAP(CONCAT(s, '-x y'))", lambda r: initcap(None if r[0] is None else r[0] + "-x y")),
    "is_digit": ("IS_DIGIT(s)", lambda r: every("Nd")(r[0])),
    "is_alpha": ("IS_ALPHA(s)", lambda r: every("L")(r[0])),
    "regexp_group": ("REGEXP_EXTRACT(s, '(l+)(o)', 3)", lambda r: None),  # no group 3: NULL (Flink catches the error)
    "regexp_negative": ("REGEXP_EXTRACT(s, '(l+)(o)', -1)", lambda r: None),
    "regexp_extract": (
        "REGEXP_EXTRACT(s, '(l+)(o)', 2)",
        lambda r: _nulls(lambda s: m.group(2) if (m := re.search("(l+)(o)", s)) else None)(r[0]),
    ),
    "from_base64": (
        "CASE WHEN s = 'aGVsbG8=' THEN FROM_BASE64(s) END",
        lambda r: base64.b64decode(r[0]).decode() if r[0] == "aGVsbG8=" else None,
    ),
    "ts_iso": (  # DateTimeFormatter on the TIMESTAMP's local date-time ('u' is the year)
        "DATE_FORMAT(ts, 'uuuu-MM-dd HH:mm:ss.SSS')",
        lambda r: _on_datetime(lambda t: t.strftime("%Y-%m-%d %H:%M:%S.") + f"{t.microsecond // 1000:03d}")(r[5]),
    ),
    "ts_text": (
        "DATE_FORMAT(ts, 'EEE, d MMM yyyy ''at'' h:mm a (D, k, K, SSSSSS)')",
        lambda r: _on_datetime(
            lambda t: (
                f"{t:%a}, {t.day} {t:%b %Y} at {(t.hour - 1) % 12 + 1}:{t:%M %p} "
                f"({t.timetuple().tm_yday}, {t.hour or 24}, {t.hour % 12}, {t.microsecond:06d})"
            )
        )(r[5]),
    ),
    "string_iso": (  # quoted text next to a field, and brackets (literal text to SimpleDateFormat)
        "DATE_FORMAT(d, 'yyyy-MM-dd''T''HH:mm:ss.SSS''Z'' [D]')",
        lambda r: _on_datetime(lambda t: f"{t.year:04d}-{t:%m-%dT%H:%M:%S}.000Z [{t.timetuple().tm_yday}]")(
            lenient(r[6])
        ),
    ),
    "computed": ("dy", lambda r: _on_datetime(lambda t: f"{t.year:04d}/{t:%m}")(lenient(r[6]))),  # a computed column
    "string_date": (  # SimpleDateFormat in UTC on the lenient parse: S is 0 (no fraction read), z is UTC
        "DATE_FORMAT(d, 'yyyyMMdd HH:mm:ss.SSS z Z')",
        lambda r: _on_datetime(lambda t: f"{t.year:04d}" + t.strftime("%m%d %H:%M:%S") + ".000 UTC +0000")(
            lenient(r[6])
        ),
    ),
}


TYPES = {"locate": "INT", "regexp": "BOOLEAN", "ascii": "INT", "is_digit": "BOOLEAN", "is_alpha": "BOOLEAN",
         "str_to_map": "MAP<STRING, STRING>", "str_to_map2": "MAP<STRING, STRING>"}  # fmt: skip


@pytest.mark.jvm
def test_string_and_date_functions_give_flinks_answers(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist([dict(zip(SCHEMA.names, row, strict=True)) for row in ROWS], SCHEMA),
                   tmp_path / "in" / "part-0.parquet")  # fmt: skip
    selected = ", ".join(f"{expression} AS {name}" for name, (expression, _) in COLUMNS.items())
    pipeline = Pipeline(parallelism=1, config={**TEST_SPARK, "spark.sql.session.timeZone": "UTC"})
    columns = ", ".join(f"{name} {TYPES.get(name, 'STRING')}" for name in COLUMNS)
    pipeline.sql(
        f"CREATE TABLE t (s STRING, a STRING, b STRING, p INT, l INT, ts TIMESTAMP(6), d STRING, "
        f"dy AS DATE_FORMAT(d, 'yyyy/MM')) WITH "
        f"('connector' = 'filesystem', 'path' = '{tmp_path / 'in'}', 'format' = 'parquet');\n"
        f"CREATE TABLE out (s STRING, a STRING, b STRING, p INT, l INT, {columns}) WITH ('connector' = "
        f"'filesystem', 'path' = '{tmp_path / 'out'}', 'format' = 'parquet');\n"
        f"INSERT INTO out SELECT s, a, b, p, l, {selected} FROM t;"
    )
    pipeline.run()
    got = read_output(tmp_path / "out")
    assert len(got) == len(ROWS)
    by_row = {tuple(None if v != v else v for v in key): row for key, row in zip(
        got[["s", "a", "b", "p", "l"]].astype(object).itertuples(index=False), got.itertuples(index=False), strict=True
    )}  # fmt: skip
    for row in ROWS:
        written = by_row[row[:5]]
        for name, (expression, flink) in COLUMNS.items():
            value = getattr(written, name)
            value = sorted(value) if name.startswith("str_to_map") and value is not None else value
            assert _plain(value) == flink(row), f"{expression} of {row}"


def _plain(value: Any) -> Any:
    """A read-back value as Python (pandas gives NaN for a null number, numpy for integers)."""
    if value is None or (isinstance(value, float) and value != value):
        return None
    return value.item() if hasattr(value, "item") else value


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ("DATE_FORMAT(ts, 'YYYY-ww')", r"DATE_FORMAT pattern 'YYYY-ww' at line 2, column \d+: 'YYYY': week-based"),
        ("DATE_FORMAT(ts, 'HH:mm z')", r"'z': Flink formats a TIMESTAMP as a local date-time, which has no time zone"),
        ("DATE_FORMAT(ts, 'nnn')", r"'nnn' is not a pattern field both Flink's DateTimeFormatter and Spark format"),
        ("DATE_FORMAT(ts, 'yyyy#')", r"'#' is reserved in a DateTimeFormatter pattern"),
        ("DATE_FORMAT(ts, 'ddd')", r"'ddd' is not a pattern field both Flink's DateTimeFormatter and Spark format"),
        ("DATE_FORMAT(ts, 'yyyy''')", r"a quote opens text it does not close; write a quote itself as ''"),
        ("DATE_FORMAT(d, 'u')", r"'u' is not a SimpleDateFormat field keyflow formats"),
        ("DATE_FORMAT(d, 'HHH')", r"'HHH' is not a SimpleDateFormat field keyflow formats"),
        ("DATE_FORMAT('2026-01-01 00:00:00', 'YYYY')", r"'YYYY' is not a SimpleDateFormat field keyflow formats"),
        ("REGEXP(s)", r"REGEXP\(…\) at line 2, column \d+ has 1 argument\(s\); write REGEXP\(s, regex\)"),
        ("SPLIT_INDEX(s, ',')", r"SPLIT_INDEX\(…\) at line 2, column \d+ has 2 argument\(s\); write SPLIT_INDEX"),
        ("STR_TO_MAP(s, ';')", r"has 2 argument\(s\); write STR_TO_MAP\(s\) or STR_TO_MAP\(s, pair_delimiter, "),
        ("INSTR(s, 'a', 2)", r"INSTR\(…\) with a start position or occurrence at line 2, column \d+ is not supported"),
    ],
)
def test_function_patterns_flink_would_fail_on_are_refused_before_spark(call: str, message: str) -> None:
    pipeline = Pipeline(parallelism=1, config=TEST_SPARK)
    with pytest.raises(SqlError, match=message):
        pipeline.sql(
            "CREATE TABLE t (s STRING, ts TIMESTAMP(3), d STRING) WITH ('connector' = 'filesystem', 'path' = "
            f"'/tmp/in', 'format' = 'parquet');\nSELECT {call} FROM t;"
        )
