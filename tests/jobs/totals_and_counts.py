"""A streaming job for damaged-checkpoint tests, run by ``keyflow run`` in a subprocess:
``tests.streams.totals_and_counts`` over the log under $KEYFLOW_TEST_DIR."""

import os

from tests.streams import totals_and_counts

pipeline = totals_and_counts(os.environ["KEYFLOW_TEST_DIR"])
