"""Damaged checkpoints, as a full disk, an interrupted copy or a cleanup script leaves them:
each damage is one error naming the file, what is wrong, the newest intact version and the
command that rolls back; the failed start changes nothing; after the rollback the job
resumes and its output equals pandas' answer for the whole input."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from keyflow import KeyflowError, Pipeline, log, parquet
from keyflow.state.checkpoint import Checkpoint
from keyflow.state.integrity import retain, verify
from keyflow.state.manifests import Manifest
from keyflow.state.rollback import plan_rollback
from keyflow.state.seal import UnsealedError, seal, unseal
from keyflow.state.state_files import write_state_file
from tests.costs import jvm_starts
from tests.streams import (
    TOTAL_SCHEMA,
    TOTAL_STATE,
    append,
    config,
    events,
    expected_counts,
    expected_totals,
    latest_counts,
    read_output,
    running_total,
    totals_and_counts,
)

ROOT = Path(__file__).resolve().parents[1]
KEYFLOW = [sys.executable, "-m", "keyflow"]
FIRST, MORE = 3_000, 500  # 6 micro-batches of 500, then one more


def build_checkpoint(base: Path) -> Path:
    """A real checkpoint after 7 micro-batches: versions 4..6 retained; version 6 is a delta on
    version 5's full files; version 4 needs neither (state.compaction.max-deltas=2)."""
    append(base / "log", events(FIRST, 100, start=0, seed=1))
    totals_and_counts(base).run(checkpoint=str(base / "ckpt"), available_now=True)
    append(base / "log", events(MORE, 100, start=FIRST, seed=2))
    totals_and_counts(base).run(checkpoint=str(base / "ckpt"), available_now=True)
    checkpoint = Checkpoint(str(base / "ckpt"))
    assert checkpoint.manifests.versions() == [4, 5, 6]
    needed = [(f.version, f.kind) for files in checkpoint.manifests.read(6).operators.values() for f in files]
    assert sorted(set(needed)) == [(5, "full"), (6, "delta")]
    return base


@pytest.fixture(scope="module")
def built_once(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A checkpoint built at one path, and a copy of it kept aside."""
    base = build_checkpoint(tmp_path_factory.mktemp("built"))
    kept = tmp_path_factory.mktemp("kept")
    shutil.copytree(base, kept, dirs_exist_ok=True)
    return base, kept


@pytest.fixture(scope="module")
def pristine(built_once: tuple[Path, Path]) -> Path:
    """The kept copy, which tests copy and never change (its manifests name the built path's
    sinks, which ``built`` puts back before each test that publishes or rolls back output)."""
    return built_once[1]


@pytest.fixture
def built(built_once: tuple[Path, Path]) -> Path:
    """A freshly built checkpoint with its own sinks, for tests that publish or roll back output:
    the kept copy put back at the path it was built at (its manifests name that path's sinks),
    so the module builds it once instead of once per test."""
    base, kept = built_once
    shutil.rmtree(base)
    shutil.copytree(kept, base)
    return base


@pytest.fixture(scope="module")
def other_pipeline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint of another pipeline (running totals only), also at version 6."""
    base = tmp_path_factory.mktemp("other")
    append(base / "log", events(7 * 500, 50, start=0, seed=9))
    pipeline = Pipeline(config=config(2))
    totals = pipeline.source(log(f"{base}/log", rows_per_batch=500)).key_by("user")
    totals.process(running_total, TOTAL_SCHEMA, state=TOTAL_STATE).sink(parquet(f"{base}/totals"))
    pipeline.run(checkpoint=str(base / "ckpt"), available_now=True)
    return base


def copy_of(pristine: Path, tmp_path: Path) -> Path:
    shutil.copytree(pristine, tmp_path, dirs_exist_ok=True)
    return tmp_path


def fingerprint(checkpoint: Path) -> dict[str, str]:
    """Every file of the checkpoint with a hash of its content (the lock file aside)."""
    return {
        str(p.relative_to(checkpoint)): hashlib.md5(p.read_bytes()).hexdigest()
        for p in checkpoint.rglob("*")
        if p.is_file() and p.name != ".keyflow.lock"
    }


def state_file(base: Path, operator: str, version: int, kind: str) -> Path:
    (found,) = (base / "ckpt" / "state").glob(f"op-{operator}*/v-{version:010d}/{kind}-00000-*.parquet")
    return found


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip(path: Path) -> None:
    """Flip one byte in the middle: same size, different content."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def edit_manifest(path: Path) -> None:
    """Valid JSON, plausible content, but not what was committed."""
    text = path.read_text()
    path.write_text(text.replace('"parallelism": 2', '"parallelism": 3', 1))


def all_input() -> pd.DataFrame:
    return pd.concat([events(FIRST, 100, start=0, seed=1), events(MORE, 100, start=FIRST, seed=2)], ignore_index=True)


# damage -> (what it does, returning the file it damaged; the problem named; the newest intact version)
Damage = Callable[[Path, Path], str]
DAMAGES: dict[str, tuple[Damage, str, int]] = {
    "delta-deleted": (lambda b, o: damage(os.remove, state_file(b, "running_total", 6, "delta")), "is missing", 5),
    "delta-truncated": (lambda b, o: damage(truncate, state_file(b, "running_total", 6, "delta")), "is truncated", 5),
    "delta-altered": (lambda b, o: damage(flip, state_file(b, "running_total", 6, "delta")), "was altered", 5),
    "full-deleted": (lambda b, o: damage(os.remove, state_file(b, "aggregate", 5, "full")), "is missing", 4),
    "full-truncated": (lambda b, o: damage(truncate, state_file(b, "aggregate", 5, "full")), "is truncated", 4),
    "full-altered": (lambda b, o: damage(flip, state_file(b, "aggregate", 5, "full")), "was altered", 4),
    "manifest-torn": (lambda b, o: damage(truncate, b / "ckpt/manifests/0000000006.json"), "is torn", 5),
    "manifest-edited": (lambda b, o: damage(edit_manifest, b / "ckpt/manifests/0000000006.json"), "was altered", 5),
    "plan-deleted": (lambda b, o: damage(os.remove, b / "ckpt/plan.json"), "is missing", 6),
    "plan-torn": (lambda b, o: damage(truncate, b / "ckpt/plan.json"), "is torn", 6),
    "plan-of-another-checkpoint": (
        lambda b, o: damage(lambda ours: shutil.copyfile(o / "ckpt/plan.json", ours), b / "ckpt/plan.json"),
        "belongs to another checkpoint",
        6,
    ),
    "manifest-of-another-pipeline": (
        lambda b, o: damage(lambda ours: shutil.copyfile(o / "ckpt/manifests/0000000006.json", ours),
                            b / "ckpt/manifests/0000000006.json"),
        "belongs to another checkpoint",
        5,
    ),
}  # fmt: skip


def damage(how: Callable[[Path], object], path: Path) -> str:
    how(path)
    checkpoint = next(parent for parent in path.parents if parent.name == "ckpt")
    return str(path.relative_to(checkpoint))


@pytest.mark.jvm
@pytest.mark.parametrize("case", list(DAMAGES))
def test_damage_is_one_error_with_the_way_back_and_changes_nothing(
    case: str, pristine: Path, other_pipeline: Path, tmp_path: Path
) -> None:
    base = copy_of(pristine, tmp_path)
    do, problem, intact = DAMAGES[case]
    file = do(base, other_pipeline)
    append(base / "log", events(500, 100, start=FIRST + MORE, seed=3))  # input goes on arriving
    before = fingerprint(base / "ckpt")
    with pytest.raises(KeyflowError) as raised:
        totals_and_counts(base).run(checkpoint=str(base / "ckpt"), available_now=True)
    message = str(raised.value)
    assert "\n" not in message
    assert f"{file} {problem}" in message, message
    assert f"the newest intact version is {intact}: roll back to it with 'keyflow checkpoints " in message
    assert f"--rollback {intact} --apply'" in message
    assert fingerprint(base / "ckpt") == before  # a failed start changes nothing


# One damage per way back: two versions rolled back (their output moved aside), a manifest that
# cannot be listed (its output removed by the restart), nothing to roll back (plan.json rewritten).
@pytest.mark.jvm
@pytest.mark.parametrize("case", ["full-deleted", "manifest-torn", "plan-deleted"])
def test_rollback_then_resume_equals_pandas(case: str, other_pipeline: Path, built: Path) -> None:
    base = built
    other_output = fingerprint(other_pipeline)
    do, _, intact = DAMAGES[case]
    do(base, other_pipeline)
    before = fingerprint(base / "ckpt")
    listed = keyflow("checkpoints", str(base / "ckpt"), "--rollback", str(intact))
    assert listed.returncode == 0, listed.stderr
    assert fingerprint(base / "ckpt") == before  # a dry run
    expected_lines = [f"delete manifests/{v:010d}.json" for v in range(6, intact, -1)]
    assert all(line in listed.stdout for line in expected_lines), listed.stdout
    applied = keyflow("checkpoints", str(base / "ckpt"), "--rollback", str(intact), "--apply")
    assert applied.returncode == 0, applied.stderr
    assert Checkpoint(str(base / "ckpt")).manifests.versions()[-1] == intact
    aside = sorted(p.name for p in (base / "totals" / "_rolled_back").rglob("part-*")) if intact < 6 else []
    unlisted = {6} if case.startswith("manifest-") else set()  # its output is removed by the restart instead
    moved = [v for v in range(intact + 1, 7) if v not in unlisted]
    assert aside == [f"part-b{v:010d}-{n:05d}.snappy.parquet" for v in moved for n in (0, 1)]
    assert ("cannot be listed" in listed.stdout) == bool(unlisted)

    append(base / "log", more := events(500, 100, start=FIRST + MORE, seed=3))
    totals_and_counts(base, parallelism=3).run(checkpoint=str(base / "ckpt"), available_now=True)
    everything = pd.concat([all_input(), more], ignore_index=True)
    got = read_output(base / "totals").sort_values("seq").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected_totals(everything).reset_index(drop=True), check_dtype=False)
    counts = latest_counts(base / "counts")
    pd.testing.assert_frame_equal(counts, expected_counts(everything), check_dtype=False)
    assert fingerprint(other_pipeline) == other_output  # a foreign manifest's output paths are not touched


@pytest.mark.jvm
def test_an_interrupted_rollback_blocks_the_start_until_it_is_finished(
    built: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = built
    checkpoint = Checkpoint(str(base / "ckpt"))
    rollback = plan_rollback(checkpoint, 4)

    def crash(version: int | None) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(checkpoint.state_files, "discard_after", crash)  # after Spark's log and the manifests went
    with pytest.raises(OSError, match="disk gone"):
        rollback.apply()
    assert checkpoint.manifests.versions() == [4]
    with pytest.raises(KeyflowError, match=r"a rollback to version 4 was interrupted; finish it with 'keyflow "
                                           r"checkpoints .*ckpt --rollback 4 --apply'"):  # fmt: skip
        totals_and_counts(base).run(checkpoint=str(base / "ckpt"), available_now=True)
    with pytest.raises(KeyflowError, match="a rollback to version 4 was interrupted; finish it first"):
        plan_rollback(Checkpoint(str(base / "ckpt")), 5)
    finished = keyflow("checkpoints", str(base / "ckpt"), "--rollback", "4", "--apply")
    assert finished.returncode == 0, finished.stderr
    assert not (base / "ckpt" / "rollback.json").exists()
    assert not list((base / "ckpt" / "state").glob("*/v-0000000005"))
    totals_and_counts(base).run(checkpoint=str(base / "ckpt"), available_now=True)
    got = read_output(base / "totals").sort_values("seq").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected_totals(all_input()).reset_index(drop=True), check_dtype=False)


@pytest.mark.jvm
def test_a_checkpoint_written_before_checksums_resumes(pristine: Path, tmp_path: Path) -> None:
    """Format 1: manifests without checksum, checkpoint id or plan copy; state files named without
    checksums; plan.json unsealed. It is read, checked for presence and sizes, and resumes."""
    base = copy_of(pristine, tmp_path)
    checkpoint = base / "ckpt"
    for state_file_path in (checkpoint / "state").rglob("*.parquet"):
        kind, first, rest = state_file_path.name.split("-")
        state_file_path.rename(state_file_path.with_name(f"{kind}-{first}-{rest.split('.')[0]}.parquet"))
    for manifest_file in (checkpoint / "manifests").glob("*.json"):
        manifest = json.loads(manifest_file.read_text())
        for key in ("checksum", "checkpoint_id", "plan"):
            manifest.pop(key)
        manifest["format_version"] = 1
        for files in manifest["operators"].values():
            for f in files:
                f.pop("checksum")
                f["path"] = re.sub(r"\.[0-9a-f]{16}\.parquet$", ".parquet", f["path"])
        manifest_file.write_text(json.dumps(manifest))
    plan = json.loads((checkpoint / "plan.json").read_text())
    plan.pop("checksum")
    (checkpoint / "plan.json").write_text(json.dumps(plan))
    assert verify(Checkpoint(str(checkpoint))).newest_intact == 6

    append(base / "log", more := events(500, 100, start=FIRST + MORE, seed=3))
    totals_and_counts(base).run(checkpoint=str(checkpoint), available_now=True)
    everything = pd.concat([all_input(), more], ignore_index=True)
    got = read_output(base / "totals").sort_values("seq").reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected_totals(everything).reset_index(drop=True), check_dtype=False)
    assert [Checkpoint(str(checkpoint)).manifests.read(v).checkpoint_id != "" for v in (5, 6, 7)] == [
        False,
        False,
        True,
    ]


@pytest.mark.jvm
def test_cli_run_prints_one_line_and_verify_finds_the_newest_intact(pristine: Path, tmp_path: Path) -> None:
    base = copy_of(pristine, tmp_path)
    flip(state_file(base, "aggregate", 5, "full"))
    cheap = keyflow("checkpoints", str(base / "ckpt"), "--verify")
    assert cheap.returncode == 0, cheap.stdout + cheap.stderr  # same sizes: only content checksums see it
    deep = keyflow("checkpoints", str(base / "ckpt"), "--verify", "--deep", "--json")
    assert deep.returncode == 1
    report = json.loads(deep.stdout)
    assert [(v["version"], v["intact"]) for v in report["versions"]] == [(6, False), (5, False), (4, True)]
    assert report["newest_intact"] == 4
    os.remove(state_file(base, "running_total", 6, "delta"))
    run = subprocess.run(
        [*KEYFLOW, "run", "tests/jobs/totals_and_counts.py", "--checkpoint", str(base / "ckpt"), "--available-now"],
        cwd=ROOT, env={**os.environ, "KEYFLOW_TEST_DIR": str(base), "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert run.returncode == 2
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, run.stderr
    assert "Traceback" not in run.stderr
    missing = r"v-0000000006/delta-00000-\d+\.[0-9a-f]{16}\.parquet is missing \(version 6 needs it\)"
    assert re.search(missing, errors[0])
    # Version 5's full file has the size recorded: only the deep check sees it, which a
    # rollback runs before it changes anything.
    assert "the newest intact version is 5" in errors[0]
    refused = keyflow("checkpoints", str(base / "ckpt"), "--rollback", "5", "--apply")
    assert refused.returncode == 2
    assert "version 5 is not intact" in refused.stderr
    assert "was altered" in refused.stderr
    assert "the newest intact version is 4" in refused.stderr
    assert "batch " not in run.stdout  # found before any micro-batch ran


@pytest.mark.jvm
def test_rollback_refuses_a_damaged_or_unknown_version(pristine: Path, tmp_path: Path) -> None:
    base = copy_of(pristine, tmp_path)
    flip(state_file(base, "aggregate", 5, "full"))
    before = fingerprint(base / "ckpt")
    for version, reason in (
        (5, "version 5 is not intact"),
        (2, "version 2 is not retained (retained: [4, 5, 6])"),
        (9, "version 9 is not retained"),
    ):
        refused = keyflow("checkpoints", str(base / "ckpt"), "--rollback", str(version), "--apply")
        assert refused.returncode == 2
        assert reason in refused.stderr, refused.stderr
    assert fingerprint(base / "ckpt") == before


@pytest.mark.jvm
def test_retention_keeps_the_newest_intact_version(pristine: Path, tmp_path: Path) -> None:
    base = copy_of(pristine, tmp_path)
    truncate(base / "ckpt/manifests/0000000006.json")
    os.remove(state_file(base, "aggregate", 5, "full"))  # versions 5 and 6 are damaged
    checkpoint = Checkpoint(str(base / "ckpt"))
    assert retain(checkpoint, 1) == [5]  # 6 (newest) and 4 (newest intact) are kept
    assert checkpoint.manifests.versions() == [4, 6]
    assert verify(checkpoint).newest_intact == 4
    assert any((base / "ckpt/state").glob("op-aggregate*/v-0000000002/full-*"))  # what version 4 needs stays


def test_state_files_name_their_checksum_and_a_retried_attempt_replaces_the_first(tmp_path: Path) -> None:
    checkpoint = Checkpoint(str(tmp_path))
    reports = []
    for values in ([1, 2], [3, 4]):  # two attempts of one subtask, different content, in the order they finished
        data = pa.table({"__key_group": pa.array([1, 2], pa.int32()), "v": values})
        reports.append(write_state_file(checkpoint, "op", 0, "delta", 0, 9, data, keys=2))
    (only,) = checkpoint.state_files.newest(reports)
    path = tmp_path / only.path
    assert only.checksum is not None
    assert path.name.endswith(f".{only.checksum}.parquet")
    assert pq.read_table(path).column("v").to_pylist() == [3, 4]  # the later attempt
    assert only.bytes == path.stat().st_size
    assert len(list(path.parent.iterdir())) == 1


def test_sealed_documents() -> None:
    text = seal({"a": 1, "b": [1.5, "x"]})
    assert unseal(text) == {"a": 1, "b": [1.5, "x"]}
    with pytest.raises(UnsealedError, match="is torn: not complete JSON"):
        unseal(text[: len(text) // 2])
    with pytest.raises(UnsealedError, match="was altered"):
        unseal(text.replace("1.5", "2.5"))
    with pytest.raises(UnsealedError, match="has no checksum"):
        unseal(json.dumps({"a": 1}))
    assert unseal(json.dumps({"a": 1}), sealed=False) == {"a": 1}  # written before sealing
    assert unseal(seal({"n": {10: 1, 2: (3, 4)}})) == {"n": {"10": 1, "2": [3, 4]}}  # as JSON reads it back


@pytest.mark.jvm
def test_manifests_of_the_first_format_are_still_read(pristine: Path) -> None:
    manifest = Checkpoint(str(pristine / "ckpt")).manifests.read(6)
    legacy = json.loads(manifest.to_json())
    legacy.pop("checksum")
    legacy["format_version"] = 1
    for files in legacy["operators"].values():
        for f in files:
            f.pop("checksum")
    old = Manifest.from_json(json.dumps(legacy), "manifests/0000000006.json")
    assert all(size is not None and digest is None for size, digest in old.needed().values())


def keyflow(*args: str) -> subprocess.CompletedProcess[str]:
    """``keyflow checkpoints ...`` as a process; it reads files only and must start no JVM."""
    before = jvm_starts()
    result = subprocess.run([*KEYFLOW, *args], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert jvm_starts() == before, f"keyflow {' '.join(args)} started a JVM"
    return result
