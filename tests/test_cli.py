"""``keyflow keygroups`` through the installed entry point and in-process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from keyflow.cli.app import app

runner = CliRunner()
KEYFLOW = Path(sys.executable).with_name("keyflow")


def run_json(*args: str) -> dict:
    result = runner.invoke(app, ["keygroups", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_installed_command_prints_the_report() -> None:
    result = subprocess.run(
        [str(KEYFLOW), "keygroups", "--parallelism", "171", "--rescale-to", "1..1024"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "max parallelism (key groups): 27720" in result.stdout
    assert "lcm(1..12)" in result.stdout
    assert "flink-legacy" in result.stdout
    assert "1.992 (at p=255)" in result.stdout  # Flink's 256 key groups rescaled to 255


def test_json_ranges_match_an_independent_split() -> None:
    report = run_json("--parallelism", "10", "--max-parallelism", "128")
    assert report["max_parallelism"] == 128
    assert report["parallelism"] == 10
    counts = [row["count"] for row in report["ranges"]]
    assert sum(counts) == 128
    assert sorted(counts) == [12] * 2 + [13] * 8  # 128 = 10 x 12.8: eight subtasks get 13
    # Contiguous ranges covering 0..127, each count = end - start + 1.
    starts = [row["start"] for row in report["ranges"]]
    ends = [row["end"] for row in report["ranges"]]
    assert starts[0] == 0
    assert ends[-1] == 127
    assert all(s == e + 1 for s, e in zip(starts[1:], ends[:-1], strict=True))
    assert all(row["count"] == row["end"] - row["start"] + 1 for row in report["ranges"])
    assert report["skew"] == pytest.approx(max(counts) / (128 / 10))
    assert report["ranges"][4] == {"subtask": 4, "start": 52, "end": 63, "count": 12}


def test_json_compares_both_policies_and_rescale() -> None:
    report = run_json("--parallelism", "171", "--rescale-to", "1..1024")
    assert report["policy"] == "keyflow"
    legacy = report["policies"]["flink-legacy"]
    assert legacy["max_parallelism"] == 256
    assert legacy["skew"] == pytest.approx(2 * 171 / 256)  # some subtasks own 2 groups, mean 1.5
    # Flink's K=256 caps the rescale range at 256; brute force over 1..256 with ceil division.
    skews = {q: -(-256 // q) * q / 256 for q in range(1, 257)}
    worst_q = max(skews, key=lambda q: (skews[q], -q))
    assert legacy["rescale"] == {
        "from": 1,
        "to": 1024,
        "limit": 256,
        "worst_skew": pytest.approx(skews[worst_q]),
        "at_parallelism": worst_q,
    }
    keyflow_worst = max(-(-27720 // q) * q / 27720 for q in range(1, 1025))
    assert report["rescale"]["worst_skew"] == pytest.approx(keyflow_worst)
    assert report["rescale"]["limit"] == 1024
    assert report["policies"]["keyflow"]["rescale"] == report["rescale"]


def test_rescale_range_is_cut_at_a_small_k() -> None:
    report = run_json("--parallelism", "10", "--policy", "flink-legacy", "--rescale-to", "1..1024")
    assert report["max_parallelism"] == 128
    assert report["rescale"]["limit"] == 128
    assert report["rescale"]["at_parallelism"] <= 128


def test_flink_legacy_policy_is_selectable() -> None:
    report = run_json("--parallelism", "86", "--policy", "flink-legacy")
    assert report["max_parallelism"] == 256
    assert "1.5 x 86 = 129" in report["reason"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--parallelism", "200", "--max-parallelism", "128"], "parallelism 200 exceeds max parallelism 128"),
        (["--parallelism", "0"], "parallelism 0 must be at least 1"),
        (["--parallelism", "4", "--policy", "fastest"], "--policy 'fastest' is not a policy; choose one of"),
        (["--parallelism", "4", "--rescale-to", "9..2"], "--rescale-to '9..2' is not a range; write it as A..B"),
        (["--parallelism", "4", "--rescale-to", "x"], "--rescale-to 'x' is not a range"),
        (["--parallelism", "4", "--max-parallelism", "99999"], "max parallelism 99999 is out of range"),
        (
            ["--parallelism", "2", "--max-parallelism", "128", "--rescale-to", "200..300"],
            "--rescale-to 200..300 starts above max parallelism 128",
        ),
    ],
)
def test_bad_options_exit_2_with_one_clear_line(args: list[str], message: str) -> None:
    result = runner.invoke(app, ["keygroups", *args])
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_long_tables_are_elided_unless_full() -> None:
    short = runner.invoke(app, ["keygroups", "--parallelism", "500"])
    full = runner.invoke(app, ["keygroups", "--parallelism", "500", "--full"])
    assert "468 more; --full lists all" in short.output
    assert "│ 250 " in full.output
    assert "│ 250 " not in short.output


def test_the_cli_starts_without_pyspark() -> None:
    """Every `keyflow` command imports the whole app; PySpark loads only when a pipeline runs."""
    check = "import keyflow.cli.app, sys; assert not [m for m in sys.modules if m.startswith('pyspark')]"
    imported = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=False)
    assert imported.returncode == 0, imported.stderr
    shown = subprocess.run([str(KEYFLOW), "keygroups", "--help"], capture_output=True, text=True, check=False)
    assert shown.returncode == 0, shown.stderr
    assert "--parallelism" in shown.stdout


@pytest.mark.parametrize("command", ["checkpoints", "timeline"])
def test_a_location_pyarrow_cannot_open_is_one_line(command: str) -> None:
    result = runner.invoke(app, [command, "nosuch://bucket/ckpt"])
    assert result.exit_code == 2
    assert "nosuch://bucket/ckpt is not a location keyflow can open" in result.output
    assert "Traceback" not in result.output
