"""Python scalar functions the SQL tests register (``CREATE FUNCTION … LANGUAGE PYTHON``)."""

from __future__ import annotations

import re

import pandas as pd

from keyflow import udf


@udf("BIGINT")
def count_char(text: pd.Series, char: pd.Series) -> pd.Series:
    """How often ``char`` occurs in ``text``: Nexmark's q14 CountChar, vectorised."""
    return text.str.count(re.escape(str(char.iloc[0]))).astype("Int64") if len(text) else text.astype("Int64")
