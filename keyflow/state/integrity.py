"""Is a checkpoint what was committed? Checks that name the damaged file and the way back.

Each manifest lists every file its version needs with the size and checksum recorded when
the file was written, and carries a checksum of its own (``keyflow.state.seal``). Checks:

- *cheap*, before every restore and by ``keyflow checkpoints DIR --verify``: plan.json and
  the newest manifest are sealed and belong to this checkpoint; every file listed exists
  with its size. One listing of ``state/``, no data read.
- *deep*, by ``--verify --deep`` and before a rollback: content checksums too.
- workers check the checksum of each state file they read (they read it anyway).

Damage is reported with the newest retained version that is intact and the command that
rolls back to it (``keyflow.state.rollback``); retention never deletes that version.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from dataclasses import dataclass
from typing import Any

from pyarrow import fs

from keyflow.errors import DamagedCheckpointError, DamagedFileError, KeyflowError
from keyflow.state.checkpoint import ROLLBACK_FILE, Checkpoint
from keyflow.state.manifests import Manifest, manifest_path
from keyflow.state.plan_file import PLAN_FILE, PlanFile, read_plan_file
from keyflow.state.seal import as_json, checksum
from keyflow.state.state_files import ALTERED, truncated, version_of


@dataclass(frozen=True)
class VersionCheck:
    version: int
    manifest: Manifest | None  # None: the manifest itself is damaged
    damage: DamagedFileError | None  # the first damage found (None: intact)

    @property
    def intact(self) -> bool:
        return self.damage is None


@dataclass(frozen=True)
class Verification:
    """plan.json and the retained versions, newest first (as far as they were checked)."""

    checkpoint: Checkpoint
    plan_file: PlanFile | None
    plan_damage: DamagedFileError | None
    versions: list[VersionCheck]
    checkpoint_id: str | None  # plan.json's, or the manifests' where plan.json is lost or a stranger

    @property
    def newest_intact(self) -> int | None:
        """The newest version a run can restore (with plan.json damaged: one holding its copy)."""
        for check in self.versions:
            if check.intact and (self.plan_damage is None or (check.manifest and check.manifest.plan)):
                return check.version
        return None

    @property
    def damage(self) -> tuple[DamagedFileError, int | None] | None:
        """What stops a restore (the damage and the version it is in), if anything."""
        if self.plan_damage is not None:
            return self.plan_damage, None
        newest = self.versions[0] if self.versions else None
        if newest is not None and newest.damage is not None:
            return newest.damage, newest.version
        return None

    def error(self) -> str | None:
        """The one-line message for what stops a restore (None: nothing does)."""
        found = self.damage
        return None if found is None else damage_message(self.checkpoint, *found, self.newest_intact)


def damage_message(checkpoint: Checkpoint, damage: DamagedFileError, version: int | None, intact: int | None) -> str:
    """``checkpoint X: <file> <problem> (version N needs it); <the way back>``."""
    needs = "" if version is None or damage.file.startswith("manifests/") else f" (version {version} needs it)"
    if intact is None:
        fix = (
            "no retained version is intact: restore the checkpoint directory from a copy, or start over with a new "
            "checkpoint directory"
        )
    else:
        restores = f", which restores {PLAN_FILE} from that version's copy" if damage.file == PLAN_FILE else ""
        fix = (
            f"the newest intact version is {intact}: roll back to it with 'keyflow checkpoints {checkpoint.uri} "
            f"--rollback {intact} --apply'{restores} (without --apply it lists what would change)"
        )
    return f"checkpoint {checkpoint.uri}: {damage.file} {damage.problem}{needs}; {fix}"


def state_sizes(checkpoint: Checkpoint) -> dict[str, int]:
    """Every file of a version directory under ``state/`` with its size, from one recursive
    listing (anything else there is not keyflow's and is left alone)."""
    selector = fs.FileSelector(checkpoint.path("state"), recursive=True, allow_not_found=True)
    start = len(checkpoint.root) + 1
    found = checkpoint.fs.get_file_info(selector)
    files = (info for info in found if info.type == fs.FileType.File and "/v-" in info.path[start:])
    return {info.path[start:]: info.size or 0 for info in files}


def check_version(
    checkpoint: Checkpoint,
    version: int,
    checkpoint_id: str | None,
    sizes: dict[str, int],
    deep: bool = False,
    bad_file: str | None = None,
) -> VersionCheck:
    """One version: its manifest, its checkpoint id, each file's presence and size (``deep``:
    content checksums; ``bad_file``: a file already found damaged)."""
    try:
        manifest = checkpoint.manifests.read(version)
    except DamagedFileError as damage:
        return VersionCheck(version, None, damage)
    if checkpoint_id and manifest.checkpoint_id and manifest.checkpoint_id != checkpoint_id:
        problem = f"belongs to another checkpoint (id {manifest.checkpoint_id}; {PLAN_FILE} has {checkpoint_id})"
        return VersionCheck(version, manifest, DamagedFileError(manifest_path(version), problem))
    for path, (size, digest) in manifest.needed().items():
        found = _check_file(checkpoint, path, size, digest, sizes, deep)
        if found is None and path == bad_file:
            found = DamagedFileError(path, "was found damaged while a run read it")
        if found is not None:
            return VersionCheck(version, manifest, found)
    return VersionCheck(version, manifest, None)


def _check_file(
    checkpoint: Checkpoint, path: str, size: int | None, digest: str | None, sizes: dict[str, int], deep: bool
) -> DamagedFileError | None:
    if path not in sizes:
        return DamagedFileError(path, "is missing")
    if size is not None and sizes[path] != size:
        return DamagedFileError(path, truncated(sizes[path], size))
    if deep and digest is not None:
        try:
            with checkpoint.fs.open_input_stream(checkpoint.path(path)) as stream:
                data = stream.read()
        except FileNotFoundError:
            return DamagedFileError(path, "is missing")
        if checksum(data) != digest:
            return DamagedFileError(path, ALTERED)
    return None


def verify(
    checkpoint: Checkpoint, deep: bool = False, every_version: bool = True, bad_file: str | None = None
) -> Verification:
    """Check plan.json and the retained versions, newest first; without ``every_version``, stop
    at the first intact one (what a restore needs). Raises CheckpointError for a manifest of a
    format this keyflow does not read (not damage: a rollback would not help)."""
    versions = checkpoint.manifests.versions()  # before the state listing: files of a newer commit are in it
    plan_file, plan_damage = None, None
    try:
        plan_file = read_plan_file(checkpoint)
        if plan_file is None and versions:
            plan_damage = DamagedFileError(PLAN_FILE, "is missing")
    except DamagedFileError as damage:
        plan_damage = damage
    sizes = state_sizes(checkpoint)
    ids = _manifest_ids(checkpoint, versions)
    checkpoint_id = plan_file.checkpoint_id if plan_file else _most_common(ids)
    if plan_file is not None and ids and plan_file.checkpoint_id not in ids.values() and len(set(ids.values())) == 1:
        checkpoint_id = _most_common(ids)  # every manifest agrees: plan.json is the stranger
        stranger = f"belongs to another checkpoint (id {plan_file.checkpoint_id}; the manifests have {checkpoint_id})"
        plan_damage = DamagedFileError(PLAN_FILE, stranger)
    checks = []
    for version in reversed(versions):
        check = check_version(checkpoint, version, checkpoint_id, sizes, deep, bad_file)
        if check.damage is not None and check.damage.problem == "is missing" and check.manifest is None:
            continue  # deleted by a running job's retention while we listed
        checks.append(check)
        if check.intact and not every_version:
            break
    if plan_damage is None and plan_file is not None:
        plan_damage = _differs_from_copy(plan_file, checks)
    return Verification(checkpoint, plan_file, plan_damage, checks, checkpoint_id)


def _differs_from_copy(plan_file: PlanFile, checks: list[VersionCheck]) -> DamagedFileError | None:
    """plan.json does not change after the first commit: it must equal the newest intact copy
    (this also catches edits to a plan.json written before plan files were sealed)."""
    copy = next((c for c in checks if c.intact and c.manifest and c.manifest.plan), None)
    if copy is None or copy.manifest is None or _as_read(copy.manifest.plan) == as_json(plan_file.to_dict()):
        return None
    return DamagedFileError(PLAN_FILE, f"was altered: it differs from the copy committed with version {copy.version}")


def _as_read(plan: dict[str, Any]) -> dict[str, Any] | None:
    """A plan file's copy as this keyflow reads and writes it (a copy of an older plan format
    equals its plan.json once both are read), None if it is not readable."""
    try:
        return as_json(PlanFile.from_dict(plan).to_dict())
    except KeyflowError:
        return None


def check_before_restore(checkpoint: Checkpoint) -> None:
    """Raise DamagedCheckpointError (one line, with the fix) if a rollback was interrupted, or
    plan.json or the newest version is damaged; reads no state data."""
    if checkpoint.exists(ROLLBACK_FILE):
        version = json.loads(checkpoint.read_text(ROLLBACK_FILE))["version"]
        raise DamagedCheckpointError(
            f"checkpoint {checkpoint.uri}: a rollback to version {version} was interrupted; finish it with "
            f"'keyflow checkpoints {checkpoint.uri} --rollback {version} --apply'"
        )
    error = verify(checkpoint, every_version=False).error()
    if error is not None:
        raise DamagedCheckpointError(error)


def damaged_while_reading(checkpoint: Checkpoint, damage: DamagedFileError) -> DamagedCheckpointError:
    """The error for a file a run found damaged: with the newest version not needing it."""
    verification = verify(checkpoint, every_version=False, bad_file=damage.file)
    versions = [check.version for check in verification.versions]
    newest = versions[0] if versions else None
    return DamagedCheckpointError(damage_message(checkpoint, damage, newest, verification.newest_intact))


def _manifest_ids(checkpoint: Checkpoint, versions: list[int]) -> dict[int, str]:
    """The checkpoint id each readable manifest carries (format 1 carries none)."""
    ids = {}
    for version in versions:
        try:
            ids[version] = checkpoint.manifests.read(version).checkpoint_id
        except DamagedFileError:
            continue
    return {version: found for version, found in ids.items() if found}


def _most_common(ids: dict[int, str]) -> str | None:
    return Counter(ids.values()).most_common(1)[0][0] if ids else None


def retain(checkpoint: Checkpoint, count: int) -> list[int]:
    """Keep the newest ``count`` versions, and the newest intact one if none of them is; delete
    older manifests and the files no kept version uses. Returns the versions dropped."""
    versions = checkpoint.manifests.versions()
    if not versions:
        return []
    sizes = state_sizes(checkpoint)
    newest_id = None
    checks: list[VersionCheck] = []
    for version in reversed(versions):
        check = check_version(checkpoint, version, newest_id, sizes)
        newest_id = newest_id or (check.manifest.checkpoint_id if check.manifest else None)
        checks.append(check)
        if len(checks) >= count and any(c.intact for c in checks):
            break
    kept = checks[:count] + [c for c in checks[count:] if c.intact][:1]
    kept_versions = {c.version for c in kept}
    dropped = [version for version in versions if version not in kept_versions]
    used = {path for c in kept if c.manifest for path in c.manifest.files()}
    for version in dropped:
        checkpoint.fs.delete_file(checkpoint.path(manifest_path(version)))
    oldest_kept = min(kept_versions)
    remaining: dict[str, int] = {}  # version directory -> files it keeps
    for relative in sizes:
        directory = checkpoint.path(relative.rsplit("/", 1)[0])
        if relative not in used and version_of(relative) < oldest_kept:
            checkpoint.fs.delete_file(checkpoint.path(relative))
            remaining.setdefault(directory, 0)
        else:
            remaining[directory] = remaining.get(directory, 0) + 1
    for directory, files in remaining.items():
        if not files:
            checkpoint.fs.delete_dir(directory)
    return dropped


def retain_known(checkpoint: Checkpoint, known: tuple[Manifest, ...], count: int) -> tuple[Manifest, ...]:
    """Retention per micro-batch, from the manifests this run read at start or committed
    (oldest first): keep the newest ``count``, delete the older manifests and the files only
    they used. It lists nothing (on an object store a listing per micro-batch is slow and
    billed). Files no manifest names (a failed task's, a key report) are left to the full
    :func:`retain` that each start runs."""
    if len(known) <= count:
        return known
    dropped, kept = known[:-count], known[-count:]
    used = {path for manifest in kept for path in manifest.files()}
    emptied = set()
    for manifest in dropped:
        _delete_if_present(checkpoint, manifest_path(manifest.version))
        for path in manifest.files():
            if path not in used:
                _delete_if_present(checkpoint, path)
                emptied.add(path.rsplit("/", 1)[0])
    if not checkpoint.on_object_store:  # where directories exist, remove those left empty
        for directory in emptied:
            listing = fs.FileSelector(checkpoint.path(directory), allow_not_found=True)
            if not checkpoint.fs.get_file_info(listing):
                checkpoint.fs.delete_dir(checkpoint.path(directory))
    return kept


def _delete_if_present(checkpoint: Checkpoint, relative: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        checkpoint.fs.delete_file(checkpoint.path(relative))
