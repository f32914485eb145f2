"""``connect``: two keyed streams in one operator with one keyed state (Flink's
``KeyedCoProcessFunction``). The example is enrichment: profiles (first stream) and clicks
(second, keyed by a column of another name) meet per user; a click waits in list state until
its user's profile is known. Whatever order the rows arrive in, across micro-batches,
restarts and a change of parallelism, the output is the inner join pandas computes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from keyflow import KeyedBatch, KeyedState, ListState, Log, Pipeline, ValueState, datagen, files, parquet, sequence
from keyflow.connectors.streams import log
from keyflow.errors import PlanError
from tests.streams import append, config, read_output, write_files

PROFILES = pa.schema([("user", pa.string()), ("country", pa.string())])
CLICKS = pa.schema([("uid", pa.string()), ("click", pa.int64())])
STATE = {"country": ValueState("string"), "pending": ListState("int64")}
OUTPUT = "user string, click bigint, country string"


def on_profile(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    """Remember the user's country; release the clicks that waited for it."""
    countries = pa.array(batch.last_per_key(batch.data.column("country").to_numpy(zero_copy_only=False)), pa.string())
    state["country"].update(countries)
    waiting = state["pending"].get().fill_null(pa.scalar([], pa.list_(pa.int64())))
    state["pending"].clear()
    owners = pc.list_parent_indices(waiting)
    return pa.table(
        {
            "user": batch.keys.column("user").take(owners),
            "click": pc.list_flatten(waiting),
            "country": countries.take(owners),
        }
    )


def on_click(batch: KeyedBatch, state: KeyedState) -> pa.Table:
    """A click of a known user is emitted with the country; the others wait in list state."""
    country = state["country"].get()
    known = np.asarray(country.is_valid().to_numpy(zero_copy_only=False))[batch.key_index]
    waiting = np.flatnonzero(~known)
    if len(waiting):
        state["pending"].add(batch.data.column("click").take(pa.array(waiting)), batch.key_index[waiting])
    rows = pa.array(np.flatnonzero(known))
    return pa.table(
        {
            "user": batch.data.column("uid").take(rows),
            "click": batch.data.column("click").take(rows),
            "country": country.take(pa.array(batch.key_index[np.flatnonzero(known)])),
        }
    )


def profiles(users: range, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({"user": [f"u{n}" for n in users], "country": rng.choice(["fr", "de", "pl"], len(users))})


def clicks(rows: int, users: int, start: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        {"uid": [f"u{n}" for n in rng.integers(0, users, rows)], "click": np.arange(start, start + rows)}
    )


def expected(all_profiles: pd.DataFrame, all_clicks: pd.DataFrame) -> pd.DataFrame:
    joined = all_clicks.merge(all_profiles, left_on="uid", right_on="user")[["user", "click", "country"]]
    return joined.sort_values("click").reset_index(drop=True)


def enrichment(p: Pipeline, first: object, second: object, out: Path) -> None:
    users, views = p.source(first, uid="profiles"), p.source(second, uid="clicks")
    enriched = users.key_by("user").connect(views.key_by("uid")).process(on_profile, on_click, OUTPUT, state=STATE)
    enriched.uid("enrich").sink(parquet(out), uid="enriched")


def got(out: Path) -> pd.DataFrame:
    return read_output(out).sort_values("click").reset_index(drop=True)


@pytest.mark.jvm
def test_connected_streams_share_keyed_state_in_a_batch_run(tmp_path: Path) -> None:
    people, views = profiles(range(0, 80), seed=1), clicks(3_000, 100, start=0, seed=2)  # users 80..99: no profile
    write_files(tmp_path / "profiles", people, PROFILES)
    write_files(tmp_path / "clicks", views, CLICKS)
    p = Pipeline(config=config(3))
    enrichment(p, files(str(tmp_path / "profiles")), files(str(tmp_path / "clicks")), tmp_path / "out")
    p.run()
    pd.testing.assert_frame_equal(got(tmp_path / "out"), expected(people, views), check_dtype=False)


@pytest.mark.jvm
def test_connected_timers_fire_whichever_input_registered_them() -> None:
    """A batch run ends with every event-time timer firing (Flink's end of input): each input
    registers a timer per key; on_timer receives each key once per timestamp, with the state
    both inputs wrote."""

    def first(batch: KeyedBatch, state: KeyedState) -> pa.Table:
        state["seen"].update(pa.array(np.full(batch.num_keys, 1, np.int64)))
        state.timers.register_event_time_timer(np.full(batch.num_keys, 1_000, np.int64))
        return pa.table(
            {"k": pa.array([], pa.int64()), "at": pa.array([], pa.int64()), "seen": pa.array([], pa.int64())}
        )

    def second(batch: KeyedBatch, state: KeyedState) -> pa.Table:
        state.timers.register_event_time_timer(np.full(batch.num_keys, 2_000, np.int64))
        return first(batch.of_rows(np.arange(0), batch.data.slice(0, 0))[0], state.of_keys(np.arange(0)))

    def fired(timers, state: KeyedState) -> pa.Table:  # type: ignore[no-untyped-def]
        stamps = timers.timestamps.cast(pa.int64())
        return pa.table({"k": timers.keys.column("k"), "at": stamps, "seen": state["seen"].get().fill_null(0)})

    p = Pipeline(config=config(2))
    evens = p.source(datagen(rows=40, fields={"k": sequence(0, 2)})).key_by("k")  # keys 0, 2, ..., 78
    thirds = p.source(datagen(rows=30, fields={"k": sequence(0, 3)})).key_by("k")  # keys 0, 3, ..., 87
    out = evens.connect(thirds).process(first, second, "k bigint, at bigint, seen bigint",
                                        state={"seen": ValueState("int64")}, on_timer=fired).to_pandas()  # fmt: skip
    want = [(k, 1_000, 1) for k in range(0, 80, 2)] + [(k, 2_000, int(k % 2 == 0 and k < 80)) for k in range(0, 90, 3)]
    assert sorted(map(tuple, out[["k", "at", "seen"]].to_numpy().tolist())) == sorted(want)


@pytest.mark.jvm
def test_connected_streams_in_a_stream_with_restart_at_another_parallelism(tmp_path: Path) -> None:
    """Clicks arrive before, with and after their user's profile, over micro-batches of both
    sources; a restart at parallelism 3 finds the waiting clicks in the state."""
    out = tmp_path / "out"

    def run(parallelism: int) -> None:
        p = Pipeline(config=config(parallelism))
        enrichment(p, log(str(tmp_path / "p"), rows_per_batch=20), log(str(tmp_path / "c"), rows_per_batch=400), out)
        p.run(checkpoint=str(tmp_path / "ckpt"), available_now=True)

    early, late = profiles(range(0, 40), seed=3), profiles(range(40, 90), seed=4)
    first_clicks, more_clicks = clicks(1_200, 100, start=0, seed=5), clicks(900, 100, start=10_000, seed=6)
    append(tmp_path / "p", early, schema=PROFILES, key="user")
    append(tmp_path / "c", first_clicks, schema=CLICKS, key="uid")
    run(2)
    pd.testing.assert_frame_equal(got(out), expected(early, first_clicks), check_dtype=False)
    append(tmp_path / "p", late, schema=PROFILES, key="user")
    append(tmp_path / "c", more_clicks, schema=CLICKS, key="uid")
    run(3)
    everything = expected(pd.concat([early, late]), pd.concat([first_clicks, more_clicks]))
    pd.testing.assert_frame_equal(got(out), everything, check_dtype=False)


def test_connect_mistakes_are_plan_errors_naming_streams_and_keys(tmp_path: Path) -> None:
    Log.create(tmp_path / "p", 2, PROFILES)
    Log.create(tmp_path / "c", 2, CLICKS)
    p = Pipeline()
    users = p.source(log(str(tmp_path / "p")), name="profiles").key_by("user")
    views = p.source(log(str(tmp_path / "c")), name="clicks")
    with pytest.raises(PlanError, match=r"first stream is keyed by \['user'\], the second by \['uid', 'click'\]"):
        users.connect(views.key_by("uid", "click")).process(on_profile, on_click, OUTPUT)
    users.connect(views.key_by("click")).process(on_profile, on_click, OUTPUT, state=STATE).sink(parquet("o"))
    with pytest.raises(PlanError, match=r"key 'user' of 'profiles' is string but key 'click' of 'clicks' is numeric"):
        p.plan()
    p = Pipeline()
    users = p.source(log(str(tmp_path / "p")), name="profiles").key_by("user")
    views = p.source(log(str(tmp_path / "c")), name="clicks")
    users.connect(views.key_by("user")).process(on_profile, on_click, OUTPUT).sink(parquet("o"))
    with pytest.raises(PlanError, match=r"the second stream \('clicks'\) has no key column\(s\) \['user'\]"):
        p.plan()
    with pytest.raises(PlanError, match="function for the second stream's rows, got 'x'"):
        users.connect(views.key_by("uid")).process(on_profile, "x", OUTPUT)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="connect\\(\\.\\.\\.\\) takes a keyed stream"):
        users.connect(views)  # type: ignore[arg-type]
    with pytest.raises(PlanError, match="of a stream of another pipeline"):
        users.connect(Pipeline().source(log(str(tmp_path / "c"))).key_by("uid"))
