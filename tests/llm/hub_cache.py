"""Test helper: put a folder into a Hugging Face Hub cache in the Hub's own layout, as `hf download` leaves it.

    <cache>/models--Org--Name/blobs/<sha256 of the file>
    <cache>/models--Org--Name/snapshots/<commit>/<path> -> ../../blobs/<sha256>
    <cache>/models--Org--Name/refs/<revision>            (the commit hash)

so huggingface_hub (and lathe through it) find the snapshot offline, by branch or tag name or by commit.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path


def put_in_hub_cache(
    folder, cache, repo_id: str, revision: str = "main", commit: str | None = None, repo_type: str = "model"
) -> str:
    """Copy every file of `folder` into `cache` as snapshot `commit` of `repo_id`, named by `revision`; the
    snapshot folder is returned. The commit defaults to a hash of the files (40 hex digits, like git's)."""
    files = sorted(path for path in Path(folder).rglob("*") if path.is_file())
    if commit is None:
        digest = hashlib.sha1()
        for path in files:
            digest.update(str(path.relative_to(folder)).encode() + path.read_bytes())
        commit = digest.hexdigest()
    repo = Path(cache) / f"{repo_type}s--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for path in files:
        blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
        shutil.copy(path, blob)
        target = snapshot / path.relative_to(folder)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            target.unlink()
        target.symlink_to(os.path.relpath(blob, target.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return str(snapshot)
