"""Everything checkable without data is checked when the plan is built, before any Spark:
aggregate expressions (parsed with sqlglot), key, ``order_by``, sink primary key, aggregate
and expression columns against the sources' known columns, ``sum``/``avg`` of a type Spark
refuses, contradicting options, splits of a pre-keyed source. These
tests are not marked ``jvm``: the test plugin refuses Spark and Java to them, so passing
proves that no JVM started."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from keyflow import (
    Log,
    Pipeline,
    ValueState,
    choice,
    datagen,
    files,
    log,
    parquet,
    random_int,
    random_string,
    sequence,
    timestamp,
)
from keyflow.cli.app import app
from keyflow.errors import PlanError, RestoreError
from keyflow.plan.aggregates import mergeable, parse_aggregations, retractable
from keyflow.plan.graph import JobGraph
from keyflow.plan.restore import check_restorable
from keyflow.plan.state_schema import StateLayout
from keyflow.state.integrity import _as_read
from keyflow.state.plan_file import PlanFile
from keyflow.state.seal import as_json
from tests.streams import EVENTS, TOTAL_SCHEMA, TOTAL_STATE, running_total

AUTO = "execution.batch.adaptive.auto-parallelism."

EVERY_MISTAKE = """
from keyflow import Pipeline, log, parquet
from tests.streams import TOTAL_SCHEMA, TOTAL_STATE, running_total

pipeline = Pipeline(config={{"parallelism.default": 2, "pipeline.max-parallelism": 8}})
events = pipeline.source(log({log!r}))
events.key_by("user").aggregate(users="count(distinct amount)").sink(parquet({out!r} + "/a"))
events.key_by("usr").aggregate(n="count(*)").sink(parquet({out!r} + "/b"))
events.key_by("user").aggregate(total="sum(amout)").sink(parquet({out!r} + "/c"))
events.key_by("user").process(running_total, TOTAL_SCHEMA, state=TOTAL_STATE, order_by="sequence").sink(
    parquet({out!r} + "/d"))
events.key_by("user").aggregate(bad="sum(").sink(parquet({out!r} + "/e"))
pre_keyed = pipeline.source(log({log!r})).reinterpret_as_keyed("user")
pre_keyed.aggregate(n="count(*)").sink(parquet({out!r} + "/f"))
events.filter("amout > 0").sink(parquet({out!r} + "/g"), primary_key="usr")
flags = events.key_by("user").process(running_total, "user string, ok boolean", state=TOTAL_STATE)
flags.key_by("user").aggregate(oks="sum(ok)").sink(parquet({out!r} + "/h"))
"""


def test_keyflow_plan_reports_every_mistake_at_once_one_line_each(tmp_path: Path) -> None:
    Log.create(tmp_path / "log", 9, EVENTS)
    file = tmp_path / "mistakes.py"
    file.write_text(EVERY_MISTAKE.format(log=str(tmp_path / "log"), out=str(tmp_path / "out")))
    result = CliRunner().invoke(app, ["plan", str(file)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert all(line.startswith("error: ") for line in lines), result.output
    expected = [
        r"aggregate users='count\(distinct amount\)' cannot be kept as running state across micro-batches",
        r"key_by column\(s\) \['usr'\] not found; available columns: \['user', 'amount', 'seq'\]",
        r"aggregate total='sum\(amout\)' reads column\(s\) \['amout'\], which are not among its input's columns",
        r"order_by column 'sequence' not found in \['user', 'amount', 'seq'\]",
        r"aggregate bad='sum\(' is not a SQL expression",
        r"source 'source: log' \(pre-keyed by \['user'\]\): the source has 9 splits, more than the max "
        r"parallelism 8.*Set pipeline.max-parallelism to at least 9",
        r"operator 'filter' \(filter\): 'amout > 0' reads column 'amout', which is not among its input's columns "
        r"\['user', 'amount', 'seq'\]; did you mean 'amount'\?",
        r"sink 'sink: .*/g': primary key column\(s\) \['usr'\] are not among its input's columns",
        r"aggregate oks='sum\(ok\)' adds up column 'ok' of type boolean, which Spark refuses",
    ]
    assert len(lines) == len(expected), result.output
    for pattern in expected:
        assert sum(bool(re.search(pattern, line)) for line in lines) == 1, (pattern, lines)


def test_a_correct_pipeline_still_plans(tmp_path: Path) -> None:
    """The same sources and operators, spelt right: no false alarms (struct fields, lambdas,
    case-insensitive columns, computed columns, expressions Spark names itself)."""
    Log.create(tmp_path / "log", 3, EVENTS)
    p = Pipeline(parallelism=2)
    events = p.source(log(str(tmp_path / "log")))
    events.key_by("user").aggregate(n="count(*)", total="SUM(Amount)", top="max(amount) filter (where seq > 3)").sink(
        parquet(tmp_path / "a")
    )
    renamed = events.select("*", "amount AS amt").key_by("user").aggregate(total="sum(amt)")
    renamed.sink(parquet(tmp_path / "f"))
    widened = events.with_columns(double="amount * 2").select("user", "double", "seq * 1")
    widened.key_by("user").aggregate(total="sum(double)", seqs="sum(`(seq * 1)`)").sink(parquet(tmp_path / "b"))
    events.key_by("user").process(
        running_total, TOTAL_SCHEMA, state={"total": ValueState("int64")}, order_by="seq"
    ).sink(parquet(tmp_path / "e"))
    generated = p.source(datagen(rows=10, fields={"k": random_int(1, 5), "n": sequence()}))
    folded = "sum(aggregate(array(n), cast(0 as bigint), (acc, v) -> acc + v))"
    generated.key_by("k").aggregate(x=folded).sink(parquet(tmp_path / "c"))
    typed = p.source(files(tmp_path / "in", schema="s struct<f: bigint>, k string"))  # may gain partition columns
    typed.key_by("dt").aggregate(total="sum(s.f)").sink(parquet(tmp_path / "d"))
    events.select("USER", "amount").key_by("user").aggregate(n="count(*)").sink(parquet(tmp_path / "g"))
    colons = events.key_by("user").process(running_total, "user: string, seq: bigint, total: bigint", order_by="seq")
    colons.key_by("user").aggregate(n="count(*)").sink(parquet(tmp_path / "h"))
    lateral = events.select("amount * 2 AS twice", "twice + 1 AS more", "user").with_columns(
        a="more + 1", b="a + 1", c="transform(array(twice), x -> x + more)", today="current_date"
    )  # lateral aliases, lambda variables, functions without parentheses
    lateral.filter("amount > 0").sink(parquet(tmp_path / "i"), primary_key="user")  # Spark finds amount below
    events.select("user", "amount").filter("seq > 0").sink(parquet(tmp_path / "j"))
    assert len(p.compile().sinks) == 10


def test_a_batch_aggregate_takes_any_spark_aggregate_but_a_stream_only_mergeable_ones(tmp_path: Path) -> None:
    Log.create(tmp_path / "log", 3, EVENTS)
    batch = Pipeline(parallelism=2)
    batch.source(datagen(rows=10, fields={"k": random_int(1, 5), "n": sequence()})).key_by("k").aggregate(
        users="count(distinct n)", median="percentile_approx(n, 0.5)", extract="count(payload:item)"
    ).sink(parquet(tmp_path / "a"))  # Spark 4's ':' is not sqlglot's: passed to Spark as written
    batch.compile()
    stream = Pipeline(parallelism=2)
    stream.source(log(str(tmp_path / "log"))).key_by("user").aggregate(
        users="count(distinct amount)", median="percentile_approx(amount, 0.5)", fine="avg(amount)"
    ).sink(parquet(tmp_path / "b"))
    with pytest.raises(PlanError) as raised:
        stream.compile()
    assert [problem.split(":")[1].split("=")[0].strip() for problem in raised.value.problems] == [
        "aggregate users",
        "aggregate median",
    ]


def _problems(pipeline: Pipeline) -> list[str]:
    with pytest.raises(PlanError) as raised:
        pipeline.compile()
    return list(raised.value.problems)


def test_expressions_reading_columns_their_input_lacks_are_plan_errors(tmp_path: Path) -> None:
    Log.create(tmp_path / "log", 3, EVENTS)
    p = Pipeline(parallelism=2)
    events = p.source(log(str(tmp_path / "log")))
    events.select("user", "amout * 2 AS double").sink(parquet(tmp_path / "a"))
    events.with_columns(flag="zzz > 1").set_name("flagged").sink(parquet(tmp_path / "b"))
    events.filter("Seq > 1 and exists(array(amount), x -> x > limit)").sink(parquet(tmp_path / "c"))
    assert _problems(p) == [
        "operator 'select' (select): 'amout * 2 AS double' reads column 'amout', which is not among its input's "
        "columns ['user', 'amount', 'seq']; did you mean 'amount'?",
        "operator 'flagged' (with_columns): 'zzz > 1' reads column 'zzz', which is not among its input's columns "
        "['user', 'amount', 'seq']; name a column of its input",
        "operator 'filter' (filter): 'Seq > 1 and exists(array(amount), x -> x > limit)' reads column 'limit', "
        "which is not among its input's columns ['user', 'amount', 'seq']; name a column of its input",
    ]


def test_a_sinks_primary_key_must_be_among_its_input_columns(tmp_path: Path) -> None:
    p = Pipeline(parallelism=2)
    generated = p.source(datagen(rows=10, fields={"k": random_int(1, 5), "n": sequence()}))
    generated.select("k").sink(parquet(tmp_path / "a"), primary_key=["k", "n"], name="out")
    assert _problems(p) == [
        "sink 'out': primary key column(s) ['n'] are not among its input's columns ['k']; name columns of the "
        "stream in primary_key"
    ]


def test_sum_and_avg_of_a_type_spark_refuses_are_plan_errors(tmp_path: Path) -> None:
    """Spark 4 refuses sum/avg of booleans and dates (and arrays, structs, maps); strings and
    timestamps it casts to double, so those pass."""
    p = Pipeline(parallelism=2)
    fields = {"k": random_int(1, 5), "ok": choice([True, False]), "s": random_string(), "t": timestamp()}
    generated = p.source(datagen(rows=10, fields=fields))
    generated.key_by("k").aggregate(a="sum(ok)", b="avg(s)", c="sum(t)", d="max(ok)", e="sum(cast(ok as int))").sink(
        parquet(tmp_path / "a")
    )
    dates = generated.key_by("k").process(running_total, "k bigint, day date, xs array<int>", order_by="k")
    dates.key_by("k").aggregate(a="mean(day)", b="sum(`xs`)").sink(parquet(tmp_path / "b"))
    assert [problem.split(": ", 1)[1] for problem in _problems(p)] == [
        "aggregate a='sum(ok)' adds up column 'ok' of type boolean, which Spark refuses (it needs a number); cast "
        "it in with_columns(...) before, or aggregate another column",
        "aggregate a='mean(day)' adds up column 'day' of type date, which Spark refuses (it needs a number); cast "
        "it in with_columns(...) before, or aggregate another column",
        "aggregate b='sum(`xs`)' adds up column '`xs`' of type array, which Spark refuses (it needs a number); cast "
        "it in with_columns(...) before, or aggregate another column",
    ]


@pytest.mark.parametrize(
    ("expression", "function", "arguments", "distinct", "filtered"),
    [
        ("count(*)", "count", (), False, False),
        ("COUNT(1)", "count", (), False, False),
        ("sum(amount)", "sum", ("amount",), False, False),
        ("avg(x) FILTER (WHERE x > 1)", "avg", ("x",), False, True),
        ("count(DISTINCT user)", "count", ("user",), True, False),
        ("mean(price * qty)", "mean", ("price * qty",), False, False),
        ("max(cast(a as double))", "max", ("cast(a as double)",), False, False),
        ("sum(x) + 1", "", (), False, False),
        ("(sum(x))", "sum", ("x",), False, False),
        ("min(x) IGNORE NULLS", "min", ("x",), False, False),
        ("max(to_char(amount, '$99.99'))", "max", ("to_char(amount, '$99.99')",), False, False),  # verbatim
        ("count()", "count", (), False, False),
        ("count(NULL)", "count", ("NULL",), False, False),  # counts non-null values: 0, as Spark
    ],
)
def test_aggregate_calls_are_recognised_without_spark(
    expression: str, function: str, arguments: tuple[str, ...], distinct: bool, filtered: bool
) -> None:
    (call,) = parse_aggregations({"a": expression})
    assert (call.function, call.arguments, call.distinct, call.filtered) == (function, arguments, distinct, filtered)


def test_merge_and_retract_rules() -> None:
    calls = parse_aggregations({"n": "count(*)", "s": "sum(x)", "m": "mean(x)", "u": "count(distinct x)"})
    with pytest.raises(PlanError, match=r"aggregate u='count\(distinct x\)' cannot be kept as running state"):
        mergeable("agg", calls)
    assert [c.function for c in mergeable("agg", calls[:3])] == ["count", "sum", "mean"]
    retracting = retractable("agg", calls, "over a changelog")
    assert [(c.function, c.argument) for c in retracting] == [
        ("count", None),
        ("sum", "x"),
        ("avg", "x"),
        ("count_distinct", "x"),
    ]
    for text in ("sum(distinct x)", "avg(x) filter (where x > 0)", "max(x, y)", "sum(x) + 1", "count()"):
        with pytest.raises(PlanError, match=r"is not supported over a changelog; an aggregate over a changelog"):
            retractable("agg", parse_aggregations({"a": text}), "over a changelog")


def _keyed_by(key: str, tmp_path: Path, distinct: bool = False) -> Pipeline:
    p = Pipeline(parallelism=2, config={"pipeline.max-parallelism": 64})
    per_user = p.source(log(str(tmp_path / "log"))).key_by(key).aggregate(n="count(*)", total="sum(amount)")
    per_user = per_user.set_name("per_user")
    again = per_user.reinterpret_as_keyed(key)
    (again.aggregate(k="count(distinct total)") if distinct else again.aggregate(k="sum(total)")).sink(
        parquet(tmp_path / "out")
    )
    return p


def test_restore_errors_name_what_changed_in_the_users_words(tmp_path: Path) -> None:
    Log.create(tmp_path / "log", 3, EVENTS)
    saved = _keyed_by("user", tmp_path).compile().graph
    with pytest.raises(
        RestoreError,
        match=r"operator 'per_user' \(uid 'per_user\[seq\]'\) cannot restore its state from checkpoint ckpt: it is "
        r"now keyed by \['seq'\], the checkpoint's state by \['user'\]\. Change it back, or start with a new "
        r"checkpoint directory",
    ):
        check_restorable(saved, _keyed_by("seq", tmp_path).compile().graph, None, False, "ckpt")
    with pytest.raises(
        RestoreError,
        match=r"it now keeps \{'k': 'count\(distinct total\)'\}, the checkpoint \{'k': 'sum\(total\)'\}; it now keeps "
        r"its state as retractable values, the checkpoint as running partials\.",
    ):
        check_restorable(saved, _keyed_by("user", tmp_path, distinct=True).compile().graph, None, False, "ckpt")
    assert check_restorable(saved, _keyed_by("user", tmp_path).compile().graph, None, False, "ckpt") == []


def test_a_new_operator_beside_the_one_that_keeps_its_state_has_no_state(tmp_path: Path) -> None:
    """The saved operator still has its uid: the new one of the same name is not taken for it."""
    Log.create(tmp_path / "log", 3, EVENTS)

    def pipeline(*keys: str) -> Pipeline:
        p = Pipeline(parallelism=2, config={"pipeline.max-parallelism": 64})
        events = p.source(log(str(tmp_path / "log")))
        for key in keys:
            events.key_by(key).aggregate(n="count(*)").set_name("per_key").sink(parquet(tmp_path / key))
        return p

    saved = pipeline("user").compile().graph
    with pytest.raises(RestoreError, match=r"operator 'per_key' \(uid 'per_key\[seq\]'\) has no state in checkpoint"):
        check_restorable(saved, pipeline("user", "seq").compile().graph, None, False, "ckpt")


def test_auto_parallelism_bounds_only_bind_a_batch_run_that_uses_them(tmp_path: Path) -> None:
    Log.create(tmp_path / "log", 3, EVENTS)
    bounds = {AUTO + "min-parallelism": 4, AUTO + "max-parallelism": 2}
    for config, source in (
        ({**bounds, AUTO + "enabled": False}, datagen(rows=10, fields={"k": random_int(1, 5)})),
        (bounds, log(str(tmp_path / "log"))),  # a stream: batch auto-parallelism does not apply
    ):
        p = Pipeline(parallelism=2, config=config)
        p.source(source).sink(parquet(tmp_path / "out"))
        p.compile()


FORMAT_2 = Path(__file__).parent / "fixtures" / "plan_format_2.json"  # written by keyflow at 57af632


def _format_2_pipeline(root: Path, reorder: bool = False) -> Pipeline:
    """The pipeline whose plan ``FORMAT_2`` holds (paths aside): a pre-keyed aggregate, a
    process with state, a key_by aggregate and a normalized changelog; ``reorder``: the same
    aggregates and state declared in another order."""
    p = Pipeline(parallelism=2, config={"pipeline.max-parallelism": 64, "pipeline.name": "format-2"})
    events = p.source(log(str(root / "log")))
    counts = {"top": "max(amount)", "n": "count(*)"} if reorder else {"n": "count(*)", "top": "max(amount)"}
    events.reinterpret_as_keyed("user").aggregate(**counts).sink(parquet(root / "a"))
    state = dict(reversed(TOTAL_STATE.items())) if reorder else TOTAL_STATE
    events.key_by("user").process(running_total, TOTAL_SCHEMA, state=state, order_by="seq").sink(parquet(root / "b"))
    totals = {"n": "count(*)", "total": "sum(amount)"} if reorder else {"total": "sum(amount)", "n": "count(*)"}
    events.key_by("user").aggregate(**totals).sink(parquet(root / "c"))
    upserts = log(str(root / "log"), changelog_mode="upsert", primary_key="user")
    p.source(upserts).key_by("user").aggregate(rows="count(*)").sink(parquet(root / "d"))
    return p


def test_a_checkpoint_of_plan_format_version_2_restores_and_its_copies_still_match(tmp_path: Path) -> None:
    """A plan.json written before state schemas were typed fields (format 2, a file the older
    release wrote) reads as the same state schemas and restores; declaring the same aggregates
    or state in another order restores too (state is stored by name); a manifest's format-2
    copy of plan.json still matches it once both are read."""
    Log.create(tmp_path / "log", 3, EVENTS)
    text = FORMAT_2.read_text()
    operators = [op for vertex in json.loads(text)["vertices"] for op in vertex["operators"]]
    assert '"format_version": 2' in text
    assert not [op for op in operators if "state" in op]  # format 2 kept what state depends on in details
    saved = JobGraph.from_dict(json.loads(text))
    for reorder in (False, True):
        current = _format_2_pipeline(tmp_path, reorder).compile().graph
        if not reorder:
            keyed = {op.uid: op.state for op in current.operators if op.state}
            assert {op.uid: op.state for op in saved.operators if op.state} == keyed
        assert check_restorable(saved, current, None, False, "ckpt") == []
    assert {op.uid: op.state.layout for op in saved.operators if op.state} == {
        "aggregate[user]": StateLayout.RUNNING,
        "running_total[user]": StateLayout.PARTIALS,
        "aggregate[user]#2": StateLayout.PARTIALS,
        "aggregate[user]#3": StateLayout.RETRACTING,
        "normalize source: log[user]": StateLayout.PARTIALS,
    }
    plan_file = PlanFile("id-1", saved)
    assert _as_read({"checkpoint_id": "id-1", "plan": json.loads(text)}) == as_json(plan_file.to_dict())
    assert _as_read({"checkpoint_id": "id-1", "plan": {**json.loads(text), "format_version": 7}}) is None


def test_checks_reach_through_lateral_aliases_and_lambdas(tmp_path: Path) -> None:
    """The expressions that pass in the correct pipeline above are checked, not skipped: a
    misspelt name inside the lambda or after the lateral alias is found; Spark's functions
    without parentheses read no column, also inside an aggregate."""
    Log.create(tmp_path / "log", 3, EVENTS)
    p = Pipeline(parallelism=2)
    events = p.source(log(str(tmp_path / "log")))
    events.select("amount * 2 AS twice", "twice + 1 AS more", "user").with_columns(
        c="transform(array(twice), x -> x + mor)", today="current_date"
    ).sink(parquet(tmp_path / "a"))
    events.key_by("user").aggregate(latest="max(localtimestamp)", who="max(current_user)").sink(parquet(tmp_path / "b"))
    with pytest.raises(PlanError) as raised:
        p.compile()
    assert len(raised.value.problems) == 1
    assert re.search(r"reads column 'mor'.*did you mean 'more'\?", raised.value.problems[0])


class _UpsertsOfUnknownColumns:
    """A user's changelog connector that cannot tell its columns before it runs."""

    changelog_mode, primary_key = "upsert", ("k",)

    def describe(self) -> dict[str, Any]:
        return {"connector": "custom"}

    def read(self, spark: Any, parallelism: int) -> Any:
        raise AssertionError("not read: the plan is refused first")


def test_an_upsert_source_must_tell_its_columns() -> None:
    with pytest.raises(
        PlanError, match=r"source 'source: custom' is an upsert changelog but does not tell its columns"
    ):
        Pipeline(parallelism=2).source(_UpsertsOfUnknownColumns())
