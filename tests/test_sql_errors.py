"""Every SQL mistake is one error naming the thing, the value and the fix; nothing runs."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
import sqlglot
from typer.testing import CliRunner

from keyflow import Log, Pipeline, blackhole, log
from keyflow.cli.app import app
from keyflow.errors import PlanError
from keyflow.sql.dialect import Flink
from keyflow.sql.errors import SqlError
from keyflow.sql.functions import spark_sql
from tests.pipelines import TEST_SPARK

runner = CliRunner()
ORDERS = (
    "CREATE TABLE orders (order_id BIGINT, user_id STRING, amount DOUBLE) "
    "WITH ('connector' = 'filesystem', 'path' = '/tmp/in', 'format' = 'parquet'{extra});\n"
)
CLICKS = (
    "CREATE TABLE clicks (user_id STRING, amount DOUBLE, ts TIMESTAMP(3), "
    "WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) WITH ('connector' = 'filesystem', 'path' = '/tmp/in', "
    "'format' = 'parquet');\n"
)
NEXMARK = "CREATE TABLE n (event_type INT, bid ROW<price BIGINT>) WITH ('connector' = 'nexmark'{extra});\n"
OUT = "CREATE TABLE out (user_id STRING, total DOUBLE) WITH ('connector' = 'blackhole'{extra});\n"


def plan(script: str, **config: object) -> Pipeline:
    pipeline = Pipeline(parallelism=2, config={**TEST_SPARK, **config})
    pipeline.sql(script)
    pipeline.plan()
    return pipeline


@pytest.mark.parametrize(
    ("script", "message"),
    [
        (
            ORDERS.format(extra=", 'scan.paralelism' = '3'"),
            r"table 'orders': connector 'filesystem' has no option 'scan.paralelism'; did you mean "
            r"'scan.parallelism'\? its options: connector, path, format, source.watch",
        ),
        (
            "CREATE TABLE t (a INT) WITH ('connector' = 'kafkaa');",
            r"table 't': connector 'kafkaa' is unknown; did you mean 'kafka'\? keyflow has datagen, filesystem, log, "
            r"upsert-log, kafka, upsert-kafka, nexmark, print",
        ),
        (
            "CREATE TABLE t (a INT) WITH ('connector' = 'kafka', 'properties.bootstrap.servers' = 'h:9092', "
            "'topic' = 't', 'scan.startup-mode' = 'earliest-offset');",
            r"table 't': connector 'kafka' has no option 'scan.startup-mode'; did you mean 'scan.startup.mode'\?",
        ),
        (
            "CREATE TABLE t (a INT) WITH ('connector' = 'kafka', 'properties.bootstrap.servers' = 'h:9092', "
            "'topic' = 't', 'format' = 'jsn');"
            "CREATE TABLE o (a INT) WITH ('connector' = 'blackhole'); INSERT INTO o SELECT a FROM t;",
            r"table 't': 'value.format' = 'jsn' is invalid; did you mean 'json'\? choose one of json, csv, raw",
        ),
        (
            "CREATE TABLE t (a INT) WITH ('connector' = 'upsert-kafka', 'properties.bootstrap.servers' = 'h:9092', "
            "'topic' = 't', 'key.format' = 'json', 'value.format' = 'json');"
            "CREATE TABLE o (a INT) WITH ('connector' = 'blackhole'); INSERT INTO o SELECT a FROM t;",
            r"table 't' \(connector 'upsert-kafka'\) needs a primary key: records are keyed by it",
        ),
        (
            "CREATE TABLE t (a INT, PRIMARY KEY (a) NOT ENFORCED) WITH ('connector' = 'kafka', "
            "'properties.bootstrap.servers' = 'h:9092', 'topic' = 't');"
            "CREATE TABLE o (a INT) WITH ('connector' = 'blackhole'); INSERT INTO o SELECT a FROM t;",
            r"table 't': the 'kafka' connector does not take a PRIMARY KEY \(as in Flink",
        ),
        (
            "CREATE TABLE t (a INT) WITH ('connector' = 'kafka', 'properties.bootstrap.servers' = 'h:9092', "
            "'topic' = 't', 'sink.partitioner' = 'fixed');",
            r"table 't': option 'sink.partitioner' is not supported: keyflow's Kafka sink partitions as Kafka's",
        ),
        (
            "CREATE TABLE t (a INT) WITH ('connector' = 'datagen', 'fields.b.min' = '1');",
            r"table 't': option 'fields.b.min' names column 'b', not one of \['a'\]",
        ),
        (
            "CREATE TABLE t (a INT) WITH ('connector' = 'datagen', 'fields.a.mx' = '1');",
            r"has no option 'fields.a.mx'; did you mean 'fields.a.max'\?",
        ),
        (
            ORDERS.format(extra=", 'source.monitor-interval' = '1 s'"),
            r"option 'source.monitor-interval' is not supported: keyflow watches a directory with 'source.watch'",
        ),
        ("CREATE TABLE t (a INT);", r"table 't' has no connector; add WITH \('connector' = 'filesystem'"),
        (
            "CREATE TABLE t (a INT, PRIMARY KEY (a)) WITH ('connector' = 'blackhole');",
            r"table 't': PRIMARY KEY \(a\) must be declared NOT ENFORCED, as in Flink",
        ),
        (
            "CREATE TABLE t (a INT, PRIMARY KEY (b) NOT ENFORCED) WITH ('connector' = 'blackhole');",
            r"table 't': PRIMARY KEY column\(s\) \['b'\] are not columns of the table \['a'\]",
        ),
        ("DROP TABLE orders;", r"DROP statement at line 1, column \d+ is not supported; keyflow runs CREATE TABLE"),
        ("SELEC 1;", r"SQL syntax error at line 1, column \d+"),
        (
            ORDERS.format(extra="") + "INSERT INTO nowhere SELECT user_id, amount FROM orders;",
            r"INSERT INTO nowhere \(line 2, column \d+\): no table 'nowhere'; declare it with CREATE TABLE nowhere",
        ),
        (
            OUT.format(extra="") + "INSERT INTO out SELECT user_id, amount FROM missing;",
            r"no table or view 'missing' to read FROM \(declared: out\); declare it with CREATE TABLE or CREATE VIEW",
        ),
        (
            ORDERS.format(extra="") + OUT.format(extra="") + "INSERT INTO out SELECT user_id FROM orders;",
            r"INSERT INTO out \(line 3, column \d+\) selects 1 column\(s\) \['user_id'\]; the table has 2: "
            r"\['user_id', 'total'\]; select them in that order",
        ),
        (
            ORDERS.format(extra="")
            + OUT.format(extra="")
            + "INSERT INTO out\nSELECT o.user_id, o.amount FROM orders o JOIN orders p ON o.amount > 1;",
            r"JOIN at line 4, column \d+ needs an equality between a column of each table",
        ),
        (
            ORDERS.format(extra="")
            + OUT.format(extra="")
            + "INSERT INTO out SELECT user_id, SUM(amount) OVER (PARTITION BY user_id) FROM orders;",
            r"OVER at line 3, column \d+ must be ORDER BY the event-time column \(the WATERMARK column\), ascending",
        ),
        (
            ORDERS.format(extra="") + OUT.format(extra="") + "INSERT INTO out SELECT user_id, amount FROM orders "
            "ORDER BY amount;",
            r"ORDER BY at line 3, column \d+ is not supported in keyflow SQL; a stream has no order",
        ),
        (
            ORDERS.format(extra="") + OUT.format(extra="") + "INSERT INTO out SELECT user_id, amount FROM orders "
            "GROUP BY user_id;",
            r"column 'amount' at line 3, column \d+ is neither in GROUP BY nor inside an aggregate function",
        ),
        (
            ORDERS.format(extra="") + OUT.format(extra="") + "INSERT INTO out SELECT user_id, STDDEV(amount) FROM "
            "orders GROUP BY user_id;",
            r"aggregate STDDEV\(amount\) at line 3, column \d+ is not supported; keyflow SQL aggregates with COUNT",
        ),
        (
            ORDERS.format(extra="")
            + OUT.format(extra="")
            + "INSERT INTO out SELECT user_id, amount FROM orders;INSERT INTO out SELECT user_id, amount FROM orders;",
            r"table 'out' is written by two INSERT statements; write each sink table once",
        ),
        (
            OUT.format(extra="") + "INSERT INTO out SELECT user_id, total FROM out;",
            r"table 'out' \(connector 'blackhole'\) can only be written to, not read FROM",
        ),
        (
            "CREATE TABLE t (k INT, op STRING) WITH ('connector' = 'blackhole');",
            r"table 't': column 'op' \(line 1, column \d+\) has the name of the row-kind column keyflow gives",
        ),
        (
            "CREATE TABLE t (s STRING) WITH ('connector' = 'datagen', 'fields.s.length' = '100'); SELECT * FROM t;",
            r"table 't': 'fields.s.length' = '100' is out of range; keyflow generates strings of 1 to 64 characters",
        ),
        (
            "CREATE TABLE t (a INT) WITH ('connector' = 'datagen', 'fields.a.min' = '10', 'fields.a.max' = '1'); "
            "SELECT * FROM t;",
            r"table 't': 'fields.a.max' = '1' is below 'fields.a.min' = '10'; give max >= min",
        ),
        (  # Flink's DataGenTableSourceFactoryTest.testLackStartForSequence
            "CREATE TABLE t (a INT) WITH ('connector' = 'datagen', 'fields.a.kind' = 'sequence', 'fields.a.end' = '9');"
            " SELECT * FROM t;",
            r"table 't': could not find required option 'fields.a.start' for the sequence generator of column 'a'",
        ),
        (  # testLackEndForSequence
            "CREATE TABLE t (a INT) WITH ('connector' = 'datagen', 'fields.a.kind' = 'sequence', "
            "'fields.a.start' = '0'); SELECT * FROM t;",
            r"table 't': could not find required option 'fields.a.end' for the sequence generator of column 'a'",
        ),
        (
            "CREATE TABLE t (a INT) WITH ('connector' = 'datagen', 'fields.a.kind' = 'sequence', "
            "'fields.a.start' = '10', 'fields.a.end' = '2'); SELECT * FROM t;",
            r"table 't': 'fields.a.end' = '2' is below 'fields.a.start' = '10'",
        ),
        (
            "CREATE TABLE t (a TIMESTAMP) WITH ('connector' = 'datagen', 'fields.a.kind' = 'sequence'); "
            "SELECT * FROM t;",
            r"'fields.a.kind' = 'sequence' needs an integer column, 'a' is TIMESTAMP",
        ),
        (
            ORDERS.format(extra=", 'scan.parallelism' = '40000'") + "SELECT * FROM orders;",
            r"table 'orders': 'scan.parallelism' = '40000' is above the largest 32768",
        ),
        (
            CLICKS + OUT.format(extra="") + "INSERT INTO out SELECT user_id, COUNT(*) FROM TABLE(TUMBLE(TABLE "
            "clicks, DESCRIPTOR(ts), INTERVAL '1' MINUTE)) GROUP BY user_id;",
            r"TUMBLE\(…\) at line 3, column \d+ is read without GROUP BY window_start, window_end",
        ),
        (
            ORDERS.format(extra="") + OUT.format(extra="") + "INSERT INTO out SELECT user_id, COUNT(*) FROM "
            "TABLE(TUMBLE(TABLE orders, DESCRIPTOR(amount), INTERVAL '1' MINUTE)) GROUP BY user_id, window_start, "
            "window_end;",
            r"TUMBLE\(TABLE orders, DESCRIPTOR\(amount\), …\) at line 3, column \d+: keyflow windows by the column "
            r"a WATERMARK is declared on, and it has no WATERMARK",
        ),
        (
            CLICKS + OUT.format(extra="") + "INSERT INTO out SELECT user_id, COUNT(*) FROM TABLE(CUMULATE(TABLE "
            "clicks, DESCRIPTOR(ts), INTERVAL '7' MINUTE, INTERVAL '1' HOUR)) GROUP BY user_id, window_start, "
            "window_end;",
            r"CUMULATE\(…\) at line 3, column \d+: its size INTERVAL '1' HOUR must be a whole number of its step "
            r"INTERVAL '7' MINUTE, as in Flink",
        ),
        (
            CLICKS + OUT.format(extra="") + "INSERT INTO out SELECT user_id, COUNT(*) FROM TABLE(HOP(TABLE "
            "clicks, DESCRIPTOR(ts), INTERVAL '1' MINUTE)) GROUP BY user_id, window_start, window_end;",
            r"HOP\(TABLE t, DESCRIPTOR\(ts\), slide, size\[, offset\]\) at line 3, column \d+ takes 2 or 3 "
            r"interval\(s\), got 1",
        ),
        (
            CLICKS + OUT.format(extra="") + "INSERT INTO out SELECT user_id, COUNT(*) FROM TABLE(TUMBLE(TABLE "
            "clicks, DESCRIPTOR(ts), INTERVAL '0' MINUTE)) GROUP BY user_id, window_start, window_end;",
            r"TUMBLE\(…\) at line 3, column \d+: INTERVAL '0' MINUTE is empty; windows need a length above zero",
        ),
        (
            CLICKS + OUT.format(extra="") + "INSERT INTO out SELECT user_id, COUNT(*) FROM TABLE(CUMULATE(TABLE "
            "clicks, DESCRIPTOR(ts), INTERVAL '0' MINUTE, INTERVAL '+5' MINUTE)) GROUP BY user_id, window_start, "
            "window_end;",
            r"CUMULATE\(…\) at line 3, column \d+: INTERVAL '0' MINUTE is empty; windows need a length above zero",
        ),
        (
            CLICKS + OUT.format(extra="") + "INSERT INTO out SELECT user_id, COUNT(*) FROM TABLE(HOP(TABLE "
            "clicks, DESCRIPTOR(ts), INTERVAL -'1' MINUTE, INTERVAL '5' MINUTE)) GROUP BY user_id, window_start, "
            "window_end;",
            r"the HOP slide at line 3, column \d+ is INTERVAL -'1' MINUTE, a negative interval; write a positive one",
        ),
        (
            CLICKS + OUT.format(extra="") + "INSERT INTO out SELECT user_id, COUNT(*) FROM TABLE(SESSION(TABLE "
            "clicks, DESCRIPTOR(ts), INTERVAL '1' MINUTE, INTERVAL '1' SECOND)) GROUP BY user_id, window_start, "
            "window_end;",
            r"SESSION\(TABLE t, DESCRIPTOR\(ts\), gap\) at line 3, column \d+ takes 1 interval\(s\), got 2",
        ),
        (
            CLICKS + OUT.format(extra="") + "INSERT INTO out SELECT user_id, TUMBLE(ts, INTERVAL '1' MINUTE) "
            "FROM clicks;",
            r"TUMBLE\(…\) at line 3, column \d+ is not supported here; use the window table function",
        ),
        (
            CLICKS + OUT.format(extra="") + "INSERT INTO out SELECT user_id, amount FROM clicks WHERE amount > "
            "(SELECT MAX(amount) FROM clicks);",
            r"a subquery at line 3, column \d+ is not supported in an expression; read it in FROM \(SELECT …\)",
        ),
        (
            CLICKS + OUT.format(extra="") + "INSERT INTO out SELECT c.user_id, LAG(c.amount) OVER (PARTITION BY "
            "c.user_id ORDER BY c.ts) FROM clicks c;",
            r"LAG\(c.amount\) OVER at line 3, column \d+ is not supported yet; keyflow runs OVER aggregations with "
            r"COUNT, SUM, AVG, MIN and MAX",
        ),
        (
            "CREATE TABLE t (a INT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts - 5) WITH ('connector' = 'blackhole');",
            r"table 't': the WATERMARK delay at line 1, column \d+ is 5; write an interval such as INTERVAL",
        ),
        (
            "CREATE TABLE t (a INT, WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH ('connector' = 'blackhole');",
            r"table 't': WATERMARK FOR ts names no column of the table \['a'\]",
        ),
        (
            "CREATE FUNCTION count_char AS 'com.example.CountChar';",
            r"CREATE FUNCTION at line 1, column \d+: count_char AS 'com.example.CountChar' is a Java function; keyflow "
            r"runs Python functions",
        ),
        (
            "CREATE FUNCTION f AS 'tests.nowhere.f' LANGUAGE PYTHON;",
            r"function 'f': cannot import 'tests.nowhere.f' \(No module named 'tests.nowhere'\)",
        ),
        (
            "CREATE FUNCTION f AS 'json.dumps' LANGUAGE PYTHON;",
            r"function 'f' has no result type; pass result_type='BIGINT' or declare it with @keyflow.udf\('BIGINT'\)",
        ),
        (
            CLICKS + ORDERS.format(extra="") + OUT.format(extra="") + "INSERT INTO out SELECT user_id, amount FROM "
            "clicks c JOIN orders o ON c.user_id = o.user_id;",
            r"column 'user_id' at line 4, column \d+ is ambiguous: tables \['c', 'o'\] both have it; qualify it",
        ),
        (
            CLICKS + ORDERS.format(extra="") + OUT.format(extra="") + "INSERT INTO out SELECT c.user_id, c.amount "
            "FROM clicks c LEFT JOIN orders o ON c.user_id = o.user_id AND o.amount > 1;",
            r"LEFT JOIN at line 4, column \d+: the condition o.amount > 1 is not an equality of the two tables nor a "
            r"bound of one.s event time by the other.s",
        ),
        (
            CLICKS + OUT.format(extra="") + "INSERT INTO out SELECT c.user_id, c.nothing FROM clicks c;",
            r"column c.nothing at line 3, column \d+: 'c' has no column 'nothing'",
        ),
        (
            NEXMARK.format(extra="") + "SELECT * FROM n;",
            r"table 'n' \(connector 'nexmark'\) declares \['event_type', 'bid'\]; the nexmark connector has the "
            r"columns \['event_type', 'person', 'auction', 'bid'\]",
        ),
        (
            NEXMARK.format(extra=", 'first-event.rate' = 'fast'").replace(
                "bid ROW<price BIGINT>", "person ROW<id BIGINT>, auction ROW<id BIGINT>, bid ROW<price BIGINT>"
            )
            + "SELECT * FROM n;",
            r"table 'n': 'first-event.rate' = 'fast' is not a number",
        ),
        (
            NEXMARK.format(extra=", 'bid.avg-size' = 'big'").replace(
                "bid ROW<price BIGINT>", "person ROW<id BIGINT>, auction ROW<id BIGINT>, bid ROW<price BIGINT>"
            )
            + "SELECT * FROM n;",
            r"table 'n': 'bid.avg-size' = 'big' is not a size; write e.g. '200b' or '1kb'",
        ),
        (
            ORDERS.format(extra="") + "CREATE VIEW v AS SELECT * FROM w; CREATE VIEW w AS SELECT * FROM v; "
            "SELECT * FROM v;",
            r"view 'v' reads itself \(through \['v', 'w'\]\)",
        ),
        (
            CLICKS + ORDERS.format(extra="") + "SELECT c.user_id FROM clicks c JOIN orders FOR SYSTEM_TIME AS OF "
            "c.ts AS o ON c.user_id = o.user_id;",
            r"FOR SYSTEM_TIME AS OF c.ts at line 3, column \d+: it is not a PROCTIME\(\) column of the stream here",
        ),
        (
            ORDERS.format(extra="") + "SELECT user_id, nothing FROM orders;",
            r"column 'nothing' at line 2, column \d+ is not a column of the tables read; they have \['amount', "
            r"'order_id', 'user_id'\]",
        ),
        (
            ORDERS.format(extra="") + "SELECT DISTINCT user_id FROM orders GROUP BY user_id, amount;",
            r"SELECT DISTINCT with GROUP BY, aggregates or windows at line 2, column \d+ is not supported yet",
        ),
        (
            CLICKS + "SELECT user_id, COUNT(*) FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(ts), INTERVAL '1' MINUTE)) "
            "WHERE window_start > TIMESTAMP '2026-01-01 00:00:00' GROUP BY user_id, window_start, window_end;",
            r"WHERE on window_start at line 2, column \d+: the windows are made after WHERE",
        ),
        (
            ORDERS.format(extra="") + "SELECT TO_TIMESTAMP_LTZ(order_id, 6) FROM orders;",
            r"TO_TIMESTAMP_LTZ\(…, 6\) at line 2, column \d+: keyflow takes the precision 0 \(seconds\) or 3",
        ),
        (
            "CREATE TABLE t (a INT) WITH ('connector.type' = 'filesystem'); SELECT * FROM t;",
            r"table 't' uses Flink's legacy 'connector.type' options",
        ),
        (
            CLICKS + "SELECT * FROM TABLE(TUMBLE(TABLE clicks, ts, INTERVAL '1' MINUTE));",
            r"TUMBLE\(TABLE …, DESCRIPTOR\(time column\), …\) expects DESCRIPTOR after the table",
        ),
        (
            "CREATE TABLE t (a INT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts, WATERMARK FOR ts AS ts) "
            "WITH ('connector' = 'blackhole');",
            r"table 't': a second WATERMARK at line 1, column \d+; a table has one",
        ),
        (
            "CREATE TABLE t (a INT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts * 2) WITH ('connector' = 'blackhole');",
            r"table 't': WATERMARK FOR ts AS ts \* 2 \(line 1, column \d+\) is not supported; keyflow takes a "
            r"bounded delay",
        ),
        (
            ORDERS.format(extra="") + "SELECT * FROM TABLE(my_rows(1));",
            r"table function TABLE\(MY_ROWS\(1\)\) at line 2, column \d+ is not supported; keyflow has the window "
            r"table functions TUMBLE, HOP and SESSION",
        ),
        (
            CLICKS + "SELECT c.user_id FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(ts), INTERVAL '1' MINUTE)) w JOIN "
            "clicks c ON w.user_id = c.user_id;",
            r"JOIN at line 2, column \d+ of a window table function and a table: join two window table functions of "
            r"the same windows \(a window join\), or aggregate the windows in a subquery",
        ),
        (
            CLICKS + ORDERS.format(extra="") + "SELECT c.user_id FROM clicks c LEFT SEMI JOIN orders o ON "
            "c.user_id = o.user_id;",
            r"LEFT SEMI JOIN at line 3, column \d+ is not supported; keyflow joins with",
        ),
        (
            CLICKS + "SELECT user_id, SESSION_ROWTIME(ts, INTERVAL '1' MINUTE) FROM clicks GROUP BY user_id, "
            "SESSION(ts, INTERVAL '1' MINUTE);",
            r"SESSION_ROWTIME\(…\) at line 2, column \d+ is not supported; use SESSION_START or SESSION_END",
        ),
        (
            CLICKS + "SELECT user_id FROM clicks GROUP BY user_id, TUMBLE(amount, INTERVAL '1' MINUTE);",
            r"TUMBLE\(amount, …\) at line 2, column \d+: keyflow windows by the column a WATERMARK is declared on "
            r"\(ts\)",
        ),
        (
            CLICKS + "SELECT user_id, COUNT(*) FROM TABLE(SESSION(TABLE clicks PARTITION BY amount, DESCRIPTOR(ts), "
            "INTERVAL '1' MINUTE)) GROUP BY user_id, window_start, window_end;",
            r"SESSION\(TABLE … PARTITION BY …\) at line 2, column \d+: keyflow keys the windows by the GROUP BY's "
            r"columns",
        ),
        (
            CLICKS + ORDERS.format(extra="") + "SELECT x.* FROM clicks c JOIN orders o ON c.user_id = o.user_id;",
            r"x\.\* at line 3, column \d+ names no table the query reads",
        ),
        (
            "CREATE TABLE t (k BIGINT, v BIGINT, w AS v + 1, PRIMARY KEY (k) NOT ENFORCED) WITH ('connector' = "
            "'upsert-log', 'path' = '/tmp/log'); SELECT * FROM t;",
            r"table 't': computed columns on a 'upsert-log' table are not supported yet; compute them in a view",
        ),
        (
            ORDERS.format(extra="") + "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY "
            "amount DESC) AS rn FROM orders);",
            r"ROW_NUMBER\(\) OVER at line 2, column \d+ without a filter on rn in the outer query: keyflow runs "
            r"ROW_NUMBER as Flink's Top-N; add WHERE rn <= N \(N = 1 deduplicates\)",
        ),
        *(
            (
                ORDERS.format(extra="") + "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY "
                f"amount DESC) AS rn FROM orders) WHERE {condition} AND amount > 0;",
                rf"{condition} at line 2, column \d+: keyflow's Top-N filters the row number with rn <= N, rn < N, "
                r"rn = M, rn >= M or rn BETWEEN M AND N \(whole numbers, M and N at least 1\)",
            )
            for condition in ("rn <= 0", "rn = 0", "rn <= amount", "rn BETWEEN 3 AND 2")
        ),
        (
            ORDERS.format(extra="") + "SELECT * FROM (SELECT *, RANK() OVER (PARTITION BY user_id ORDER BY amount) "
            "AS r FROM orders) WHERE r <= 3;",
            r"RANK\(\) OVER at line 2, column \d+ is not supported yet; keyflow's Top-N numbers rows with ROW_NUMBER",
        ),
        (
            ORDERS.format(extra="") + "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY "
            "amount NULLS LAST) AS rn FROM orders) WHERE rn = 1;",
            r"NULLS LAST at line 2, column \d+: keyflow's Top-N puts nulls first ascending and last descending",
        ),
        (
            ORDERS.format(extra="") + "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (ORDER BY amount) AS rn FROM "
            "orders) WHERE rn <= 3;",
            r"ROW_NUMBER\(\) OVER at line 2, column \d+ needs PARTITION BY and ORDER BY",
        ),
        (
            ORDERS.format(extra="") + "SELECT user_id, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY amount) AS rn "
            "FROM orders;",
            r"ROW_NUMBER\(\) OVER at line 2, column \d+ runs as Flink's Top-N only as a column of a derived table, "
            r"view or WITH query that the query reading it filters",
        ),
        (
            ORDERS.format(extra="") + "SELECT * FROM (SELECT user_id, ROW_NUMBER() OVER (PARTITION BY user_id ORDER "
            "BY amount) FROM orders) WHERE user_id = 'a';",
            r"ROW_NUMBER\(\) OVER at line 2, column \d+: keyflow runs one, named \(… AS rownum\), per query",
        ),
        (
            ORDERS.format(extra="") + "SELECT * FROM (SELECT user_id, COUNT(*) AS n, ROW_NUMBER() OVER (PARTITION BY "
            "user_id ORDER BY user_id) AS rn FROM orders GROUP BY user_id) WHERE rn = 1;",
            r"ROW_NUMBER\(\) OVER at line 2, column \d+ in a query with GROUP BY, aggregates or DISTINCT",
        ),
        (
            ORDERS.format(extra="") + "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY "
            "amount DESC) AS rn FROM orders) WHERE rn >= 1;",
            r"rn >= 1 at line 2, column \d+ keeps every row: keyflow's Top-N needs an upper bound, rn <= N",
        ),
        (
            ORDERS.format(extra="") + "SELECT * FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY "
            "amount DESC) AS rn FROM orders) WHERE rn > 3 AND rn <= 3;",
            r"the filters on rn at line 2, column \d+ keep no row \(from 4 to 3\); widen the range",
        ),
        (
            CLICKS + "CREATE TABLE u (user_id STRING, n BIGINT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts - INTERVAL "
            "'5' SECOND, PRIMARY KEY (user_id) NOT ENFORCED) WITH ('connector' = 'upsert-kafka', 'topic' = 't', "
            "'properties.bootstrap.servers' = 'h:9092', 'key.format' = 'json', 'value.format' = 'json');\n"
            "SELECT * FROM u JOIN clicks c ON u.user_id = c.user_id AND c.ts BETWEEN u.ts - INTERVAL '1' MINUTE "
            "AND u.ts;",
            r"JOIN at line 3, column \d+: its left table is updated or retracted \(a streaming GROUP BY, Top-N or "
            r"outer join, or a changelog table\); a time-bounded \(interval or window\) join takes tables of inserts",
        ),
        (
            CLICKS + "SELECT MAX(window_time) FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(ts), INTERVAL '1' MINUTE)) "
            "GROUP BY window_start, window_end;",
            r"window_time at line 2, column \d+ inside an aggregate, a FILTER or a GROUP BY expression",
        ),
        (
            CLICKS + "SELECT COUNT(*) FROM TABLE(TUMBLE(TABLE clicks, DESCRIPTOR(ts), INTERVAL '1' MINUTE)) "
            "GROUP BY window_start, window_end, HOUR(window_time);",
            r"window_time at line 2, column \d+ inside an aggregate, a FILTER or a GROUP BY expression",
        ),
        (
            "EXECUTE STATEMENT SET BEGIN " + ORDERS.format(extra="") + "END;",
            r"a statement set \(EXECUTE STATEMENT SET BEGIN … END\) holds only INSERT INTO statements",
        ),
    ],
)
def test_sql_mistakes_are_one_clear_error(script: str, message: str) -> None:
    with pytest.raises(SqlError, match=message):
        plan(script)


def test_a_join_of_two_updating_tables_plans_as_a_changelog_join() -> None:
    """Both inputs carry row kinds (``op``): not a column both have, but the join's own."""
    pipeline = plan(
        ORDERS.format(extra=", 'source.watch' = 'true'")
        + "CREATE TABLE out (user_id STRING, n BIGINT, total DOUBLE, PRIMARY KEY (user_id) NOT ENFORCED) WITH "
        "('connector' = 'filesystem', 'path' = '/tmp/out', 'format' = 'parquet');\n"
        "INSERT INTO out SELECT a.user_id, a.n, b.total FROM (SELECT user_id, COUNT(*) AS n FROM orders GROUP BY "
        "user_id) a JOIN (SELECT user_id, SUM(amount) AS total FROM orders GROUP BY user_id) b "
        "ON a.user_id = b.user_id;"
    )
    assert "changelog_join" in pipeline.plan().render()


def test_flink_meanings_apply_inside_other_calls_and_literals_are_flinks() -> None:
    def spark(text: str) -> str:
        return spark_sql(sqlglot.parse_one(f"SELECT {text}", read=Flink).expressions[0])

    nested = spark("REGEXP_EXTRACT(SPLIT_INDEX(u, '/', 2), 'a(b)', 1)")
    assert "SPLIT_INDEX" not in nested
    assert nested.startswith("CASE WHEN CASE WHEN u IS NULL THEN NULL ELSE CASE WHEN 2 >= 0 AND u <> '' THEN ")
    assert spark("COUNT(x) FILTER (WHERE REGEXP_EXTRACT(u, 'a') IS NULL)") == (
        "COUNT(CASE WHEN CASE WHEN u RLIKE 'a' THEN REGEXP_EXTRACT(u, 'a', 0) END IS NULL THEN x END)"
    )
    assert (
        spark("COUNT(DISTINCT a, b) FILTER (WHERE c)")
        == "COUNT(DISTINCT CASE WHEN c THEN a END, CASE WHEN c THEN b END)"
    )
    assert spark("'it''s'") == "'it\\'s'"  # Flink's quote in a literal, as Spark writes it
    assert (
        spark("REGEXP_EXTRACT(u, '(\\d+)')") == "CASE WHEN u RLIKE '(\\\\d+)' THEN REGEXP_EXTRACT(u, '(\\\\d+)', 0) END"
    )


def test_select_star_over_a_join_names_columns_as_flink() -> None:
    pipeline = Pipeline(parallelism=2, config=TEST_SPARK)
    pipeline.sql(
        "CREATE TABLE a (k BIGINT, k2 BIGINT) WITH ('connector' = 'filesystem', 'path' = '/tmp/a', 'format' = 'csv');"
        "CREATE TABLE b (k BIGINT, z BIGINT) WITH ('connector' = 'filesystem', 'path' = '/tmp/b', 'format' = 'csv');"
    )
    both = pipeline.sql("SELECT * FROM a JOIN b ON a.k = b.z")
    assert [e.rsplit(" AS ", 1)[1] for e in both.node.expressions] == ["`k`", "`k2`", "`k0`", "`z`"]
    right = pipeline.sql("SELECT b.* FROM a JOIN b ON a.k2 = b.k")
    assert [e.rsplit(" AS ", 1)[1] for e in right.node.expressions] == ["`k0`", "`z`"]


def test_comments_anywhere_and_after_the_last_statement() -> None:
    script = (
        ORDERS.format(extra="")
        + "-- a comment\n"
        + OUT.format(extra="")
        + ("INSERT INTO out /* inline */ SELECT user_id, amount FROM orders; -- after\n-- and a last line")
    )
    pipeline = plan(script)
    assert [vertex.name for vertex in pipeline.plan().vertices][-1].endswith("sink: out")


@pytest.mark.parametrize(
    ("value", "message"),
    [("0", "unbounded"), ("100", "100")],
)
def test_nexmark_events_num_zero_is_unbounded_as_in_flink(value: str, message: str) -> None:
    columns = "event_type INT, person ROW<id BIGINT>, auction ROW<id BIGINT>, bid ROW<price BIGINT>"
    pipeline = Pipeline(parallelism=2, config=TEST_SPARK)
    pipeline.sql(
        f"CREATE TABLE n ({columns}) WITH ('connector' = 'nexmark', 'events.num' = '{value}'); SELECT * FROM n;"
    )
    source = next(node for node in pipeline.builder.operators.values() if node.kind == "source")
    assert source.source.unbounded == (value == "0"), message


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", r"table 'orders': 'scan.parallelism' = '0' must be at least 1; set 'scan.parallelism' to a whole number"),
        ("three", r"table 'orders': 'scan.parallelism' = 'three' is not an integer; set 'scan.parallelism'"),
        ("200", r"'scan.parallelism' = '200' is above pipeline.max-parallelism 128; set 'scan.parallelism' to a whole "
                r"number from 1 to 128, or remove it to use parallelism.default, or raise pipeline.max-parallelism"),
    ],
)  # fmt: skip
def test_invalid_scan_parallelism_names_table_option_value_and_fix(value: str, message: str) -> None:
    script = ORDERS.format(extra=f", 'scan.parallelism' = '{value}'") + OUT.format(extra="")
    with pytest.raises(SqlError, match=message):
        plan(script + "INSERT INTO out SELECT user_id, amount FROM orders;", **{"pipeline.max-parallelism": 128})


def test_invalid_sink_parallelism_is_refused() -> None:
    script = ORDERS.format(extra="") + OUT.format(extra=", 'sink.parallelism' = '-1'")
    with pytest.raises(SqlError, match=r"table 'out': 'sink.parallelism' = '-1' must be at least 1"):
        plan(script + "INSERT INTO out SELECT user_id, amount FROM orders;")


def changelog_log(path: Path) -> str:
    schema = pa.schema(
        [("order_id", pa.int64()), ("user_id", pa.string()), ("amount", pa.float64()), ("op", pa.string())]
    )
    Log.create(path, 2, schema)
    return str(path)


def test_changelog_source_at_another_parallelism_needs_a_primary_key(tmp_path: Path) -> None:
    path = changelog_log(tmp_path / "log")
    script = (
        "CREATE TABLE orders (order_id BIGINT, user_id STRING, amount DOUBLE) WITH ('connector' = 'log', "
        f"'path' = '{path}', 'format' = 'changelog', 'scan.parallelism' = '3');"
        + OUT.format(extra="")
        + "INSERT INTO out SELECT user_id, amount FROM orders;"
    )
    message = r"table 'orders' is a changelog with 'scan.parallelism' = '{}': .* declare PRIMARY KEY \(…\) NOT ENFORCED"
    with pytest.raises(SqlError, match=message.format(3)):
        plan(script)
    with pytest.raises(SqlError, match=message.format(2)):  # as Flink: also at the default parallelism
        plan(script.replace("'scan.parallelism' = '3'", "'scan.parallelism' = '2'"))
    plan(script.replace("amount DOUBLE)", "amount DOUBLE, PRIMARY KEY (order_id) NOT ENFORCED)"))  # keyed: fine


def test_changelog_into_a_sink_of_another_parallelism_needs_a_primary_key(tmp_path: Path) -> None:
    path = changelog_log(tmp_path / "log")
    script = (
        "CREATE TABLE orders (order_id BIGINT, user_id STRING, amount DOUBLE, PRIMARY KEY (order_id) NOT ENFORCED) "
        f"WITH ('connector' = 'log', 'path' = '{path}', 'format' = 'changelog');"
        + OUT.format(extra=", 'sink.parallelism' = '3'")
        + "INSERT INTO out SELECT user_id, amount FROM orders;"
    )
    message = r"sink 'sink: out' runs at parallelism 3 and its input 'to out' at 2, and the input is a changelog: "
    with pytest.raises(PlanError, match=message + r".*declare a primary key \(SQL: PRIMARY KEY \(...\) NOT ENFORCED"):
        plan(script)
    keyed_script = script.replace("total DOUBLE)", "total DOUBLE, PRIMARY KEY (user_id) NOT ENFORCED)")
    (sink,) = [operator for operator in plan(keyed_script).plan().operators if operator.kind == "sink"]
    assert sink.input_partitioner == "hash"
    # NONE with a primary key: not routed, and allowed (Flink's CommonExecSink fails only without a key)
    (sink,) = [op for op in plan(keyed_script, **{"table.exec.sink.keyed-shuffle": "NONE"}).plan().operators
               if op.kind == "sink"]  # fmt: skip
    assert sink.input_partitioner == "rebalance"


def test_upsert_log_needs_a_primary_key_and_matching_columns(tmp_path: Path) -> None:
    Log.create(tmp_path / "log", 2, pa.schema([("order_id", pa.int64()), ("amount", pa.float64())]))
    table = f"WITH ('connector' = 'upsert-log', 'path' = '{tmp_path / 'log'}');"
    with pytest.raises(SqlError, match=r"table 'orders' \(connector 'upsert-log'\) needs a primary key: .* declare "
                       r"PRIMARY KEY \(…\) NOT ENFORCED"):  # fmt: skip
        plan(f"CREATE TABLE orders (order_id BIGINT, amount DOUBLE) {table} SELECT * FROM orders;")
    with pytest.raises(SqlError, match=r"table 'orders': the log at .* has columns \['order_id', 'amount'\], the "
                       r"table declares \['order_id', 'price'\]"):  # fmt: skip
        plan(
            f"CREATE TABLE orders (order_id BIGINT, price DOUBLE, PRIMARY KEY (order_id) NOT ENFORCED) {table} "
            "SELECT * FROM orders;"
        )


def test_the_cli_prints_one_line_and_exits_2(tmp_path: Path) -> None:
    script = tmp_path / "bad.sql"
    script.write_text(ORDERS.format(extra=", 'scan.parallelism' = '0'") + OUT.format(extra="")
                      + "INSERT INTO out SELECT user_id, amount FROM orders;")  # fmt: skip
    result = runner.invoke(app, ["sql", str(script)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: table 'orders': 'scan.parallelism' = '0' must be at least 1; set 'scan.parallelism' to a whole "
        "number from 1 to 32768, or remove it to use parallelism.default"
    ]
    missing = runner.invoke(app, ["sql", str(tmp_path / "nope.sql")])
    assert missing.exit_code == 2
    assert "SQL file" in missing.output
    assert "does not exist" in missing.output


def test_keyflow_plan_checks_a_sql_script_before_spark(tmp_path: Path) -> None:
    """``keyflow plan job.sql`` reports a SQL mistake (a Top-N by processing time) with no JVM,
    and prints the plan of a good script."""
    bad = tmp_path / "bad.sql"
    bad.write_text(CLICKS + OUT.format(extra="") + "INSERT INTO out SELECT user_id, amount FROM (SELECT *, "
                   "ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY p) AS rn FROM (SELECT *, PROCTIME() AS p "
                   "FROM clicks)) WHERE rn <= 2;")  # fmt: skip
    refused = runner.invoke(app, ["plan", str(bad)])
    assert refused.exit_code == 2
    assert refused.output.startswith("error: ROW_NUMBER() OVER (… ORDER BY p) at line 3, column ")
    good = tmp_path / "good.sql"
    good.write_text(CLICKS + OUT.format(extra="") + "INSERT INTO out SELECT user_id, amount FROM (SELECT *, "
                    "ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY amount DESC) AS rn FROM clicks) "
                    "WHERE rn <= 2;")  # fmt: skip
    planned = runner.invoke(app, ["plan", str(good), "-p", "3"])
    assert planned.exit_code == 0, planned.output
    assert "rank (uid top-n (out)[user_id]): keys=['user_id'], order=['amount DESC'], limit=2" in planned.output
    assert "parallelism 3" in planned.output


def test_a_log_not_split_by_the_primary_key_is_refused_as_a_changelog(tmp_path: Path) -> None:
    """Offsets order the changes of a key only inside one split: a log appended without the
    key (or by another key) cannot be read as upserts of it."""
    schema = pa.schema([("order_id", pa.int64()), ("amount", pa.float64())])
    Log.create(tmp_path / "log", 2, schema).append(pa.table({"order_id": [1, 1], "amount": [1.0, 2.0]}))
    with pytest.raises(PlanError, match=r"log .* is not split by a key \(some append had no key=\), so the changes "
                       r"of a primary key \['order_id'\] may be in several splits"):  # fmt: skip
        log(str(tmp_path / "log"), changelog_mode="upsert", primary_key="order_id")
    changes = changelog_log(tmp_path / "changes")
    with pytest.raises(PlanError, match=r"append to changelog .* needs key= \(--key\)"):
        Log(changes).append(pa.table({"order_id": [1], "user_id": ["a"], "amount": [1.0], "op": ["+I"]}))


@pytest.mark.jvm
def test_python_streams_that_lose_row_kinds_are_refused(tmp_path: Path) -> None:
    schema = pa.schema([("id", pa.int64()), ("user", pa.string()), ("amount", pa.int64())])
    Log.create(tmp_path / "log", 2, schema).append(pa.table({"id": [1], "user": ["a"], "amount": [3]}), key="id")
    p = Pipeline(parallelism=2, config={**TEST_SPARK, "execution.checkpointing.interval": "0 s"})
    orders = p.source(log(str(tmp_path / "log"), changelog_mode="upsert", primary_key="id"))
    orders.select("user", "amount").key_by("user").aggregate(total="sum(amount)").sink(blackhole())
    with pytest.raises(PlanError, match=r"operator 'aggregate': its input is a changelog, but the rows reaching it "
                       r"have no 'op' column \(a select or map_batches before it dropped it\)"):  # fmt: skip
        p.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)

    q = Pipeline(parallelism=2, config=TEST_SPARK)
    plain = q.source(log(str(tmp_path / "log")))
    q.create_temporary_view("per_user", plain.key_by("user").aggregate(total="sum(amount)"))
    with pytest.raises(SqlError, match=r"view 'per_user' is a streaming aggregate of the Python API: it emits each "
                       r"changed key's new value without row kinds"):  # fmt: skip
        q.sql("SELECT user, SUM(total) AS s FROM per_user GROUP BY user")


def test_appending_a_bad_row_kind_to_a_changelog_log_is_refused(tmp_path: Path) -> None:
    changelog_log(tmp_path / "log")
    rows = pa.table({"order_id": [1, 2], "user_id": ["a", "b"], "amount": [1.0, 2.0], "op": ["+I", "U"]})
    with pytest.raises(PlanError, match=r"append to changelog .*: row 1 has op='U'; a row kind is one of"):
        Log(tmp_path / "log").append(rows, key="order_id")
    assert Log(tmp_path / "log").end_offsets() == [0, 0]  # nothing written
