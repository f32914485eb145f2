"""Roll a checkpoint back to an earlier retained version that is intact.

What changes (``plan_rollback`` lists it; nothing happens until ``apply``):

- sink output that versions after V published is moved aside into ``_rolled_back/<time>/``
  in its directory (readers skip ``_`` names): output stays consistent with V, nothing is lost;
- plan.json is rewritten from V's copy where it is missing, damaged or different;
- Spark's source log forgets the micro-batches after V, so the source replays from V's offsets;
- the manifests after V are deleted, newest first, then the state written after V.

``rollback.json`` is written first and removed last: while it is there a start refuses and
names the command that finishes the rollback (every step repeats safely).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from keyflow.errors import CheckpointError
from keyflow.paths import exists, filesystem
from keyflow.state.checkpoint import ROLLBACK_FILE, SOURCE_DIR, Checkpoint
from keyflow.state.integrity import check_version, state_sizes, verify
from keyflow.state.manifests import manifest_path
from keyflow.state.plan_file import PLAN_FILE, PlanFile, write_plan_file


@dataclass
class Rollback:
    """What rolling ``checkpoint`` back to ``version`` changes."""

    checkpoint: Checkpoint
    version: int
    plan_file: PlanFile | None  # rewritten from the version's copy (None: plan.json is right)
    moves: list[tuple[str, str]] = field(default_factory=list)  # published output -> aside
    spark_log: list[str] = field(default_factory=list)  # under source/, relative to the checkpoint
    manifests: list[int] = field(default_factory=list)  # newest first
    state_dirs: list[str] = field(default_factory=list)
    unlisted: list[int] = field(default_factory=list)  # damaged versions whose output is unknown

    def changes(self) -> list[str]:
        """One line per change, for people."""
        lines = [f"move aside {source} -> {target}" for source, target in self.moves]
        if self.plan_file is not None:
            lines.append(f"rewrite {PLAN_FILE} from version {self.version}'s copy")
        lines += [f"delete {path} (Spark's source log)" for path in self.spark_log if self.checkpoint.exists(path)]
        lines += [f"delete {manifest_path(version)}" for version in self.manifests]
        lines += [f"delete {directory}/" for directory in self.state_dirs]
        lines += [
            f"output of version {version} cannot be listed (its manifest is damaged or another checkpoint's): the "
            f"pipeline's next run removes its sinks' output of micro-batches after {self.version}, as on every restart"
            for version in self.unlisted
        ]
        return lines

    def apply(self) -> None:
        """Make the changes (the caller holds the checkpoint's lock)."""
        self.checkpoint.write_atomically(ROLLBACK_FILE, json.dumps({"version": self.version}).encode())
        for source, target in self.moves:
            files, path = filesystem(source)
            if exists(files, path):
                aside = filesystem(target)[1]
                files.create_dir(aside.rsplit("/", 1)[0], recursive=True)
                files.move(path, aside)
        if self.plan_file is not None:
            write_plan_file(self.checkpoint, self.plan_file)
        for relative in self.spark_log:
            _delete_log_entry(self.checkpoint, relative)
        for version in self.manifests:
            _delete_file(self.checkpoint, manifest_path(version))
        self.checkpoint.state_files.discard_after(self.version)
        self.checkpoint.append_event(
            {
                "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
                "event": "rollback",
                "batch": self.version,
                "reason": f"rolled back to version {self.version}",
            }
        )
        self.checkpoint.fs.delete_file(self.checkpoint.path(ROLLBACK_FILE))


def plan_rollback(checkpoint: Checkpoint, version: int) -> Rollback:
    """What rolling back to ``version`` changes; raises CheckpointError (with the reason) if
    it is not retained, not intact (content checksums included) or Spark no longer logs it."""
    if checkpoint.exists(ROLLBACK_FILE):
        started = json.loads(checkpoint.read_text(ROLLBACK_FILE))["version"]
        if started != version:
            raise CheckpointError(
                f"checkpoint {checkpoint.uri}: a rollback to version {started} was interrupted; finish it first with "
                f"'keyflow checkpoints {checkpoint.uri} --rollback {started} --apply'"
            )
    versions = checkpoint.manifests.versions()
    if version not in versions:
        raise CheckpointError(
            f"checkpoint {checkpoint.uri}: version {version} is not retained (retained: {versions or 'none'}); "
            "roll back to one of those"
        )
    verification = verify(checkpoint, every_version=False)
    target = check_version(checkpoint, version, verification.checkpoint_id, state_sizes(checkpoint), deep=True)
    if target.damage is not None or target.manifest is None:
        intact = verify(checkpoint, deep=True, every_version=False).newest_intact
        way_back = f"the newest intact version is {intact}" if intact is not None else "no retained version is intact"
        raise CheckpointError(
            f"checkpoint {checkpoint.uri}: version {version} is not intact ({target.damage}); {way_back} "
            f"('keyflow checkpoints {checkpoint.uri} --verify --deep' checks every version)"
        )
    manifest = target.manifest
    copy = PlanFile.from_dict(manifest.plan) if manifest.plan else None
    plan_file = None
    current = verification.plan_file
    if verification.plan_damage is not None or current is None or (copy and copy.to_dict() != current.to_dict()):
        if copy is None:
            raise CheckpointError(
                f"checkpoint {checkpoint.uri}: {PLAN_FILE} is missing or damaged and version {version} holds no copy "
                "of it (written by an older keyflow); restore it from a copy of the checkpoint"
            )
        plan_file = copy
    offsets = checkpoint.source_batches("offsets")
    if offsets and version not in offsets:
        raise CheckpointError(
            f"checkpoint {checkpoint.uri}: Spark's source log no longer holds micro-batch {version} (it keeps "
            f"{min(offsets)}..{max(offsets)}), so its input cannot be replayed from there; roll back to a newer version"
        )
    rollback = Rollback(checkpoint, version, plan_file)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    own = manifest.checkpoint_id  # V is intact: its id is this checkpoint's
    for later in sorted((v for v in versions if v > version), reverse=True):
        rollback.manifests.append(later)
        published = _published_by(checkpoint, later, own)
        if published is None:
            rollback.unlisted.append(later)
        for final in published or []:
            directory, name = final.rsplit("/", 1)
            rollback.moves.append((final, f"{directory}/_rolled_back/{stamp}/{name}"))
    rollback.spark_log = spark_log_after(checkpoint, version)
    rollback.state_dirs = checkpoint.state_files.dirs_after(version)
    return rollback


def spark_log_after(checkpoint: Checkpoint, version: int) -> list[str]:
    """Spark's source log entries of micro-batches after ``version``, newest first; commits
    before offsets, so Spark never sees a commit without its offsets."""
    entries = []
    for log in ("commits", "offsets"):
        newer = [batch for batch in checkpoint.source_batches(log) if batch > version]
        entries += [f"{SOURCE_DIR}/{log}/{batch}" for batch in reversed(newer)]
    return entries


def forget_uncommitted(checkpoint: Checkpoint, version: int) -> None:
    """Remove what micro-batches after the committed ``version`` wrote (a failed run's state
    files and Spark's plan of its batch), leaving the checkpoint as that version left it."""
    checkpoint.state_files.discard_after(version)
    for relative in spark_log_after(checkpoint, version):
        _delete_log_entry(checkpoint, relative)


def _published_by(checkpoint: Checkpoint, version: int, own_id: str) -> list[str] | None:
    """The sink files ``version`` published that are still there (None: its manifest is damaged
    or another checkpoint's, so its output paths are not to be trusted)."""
    try:
        manifest = checkpoint.manifests.read(version)
    except CheckpointError:
        return None
    if manifest.checkpoint_id != own_id:  # format 1 manifests carry none: only trusted among themselves
        return None
    finals = [final for staged in manifest.sinks for _, final in staged["moves"]]
    return [final for final in finals if exists(*filesystem(final))]


def _delete_file(checkpoint: Checkpoint, relative: str) -> None:
    if checkpoint.exists(relative):
        checkpoint.fs.delete_file(checkpoint.path(relative))


def _delete_log_entry(checkpoint: Checkpoint, relative: str) -> None:
    """A Spark log entry and the checksum file Hadoop's local filesystem keeps beside it (a
    stale one would fail Spark's read of the entry it writes next under that name)."""
    directory, name = relative.rsplit("/", 1)
    _delete_file(checkpoint, relative)
    _delete_file(checkpoint, f"{directory}/.{name}.crc")
