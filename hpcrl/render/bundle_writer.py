"""Write a code bundle (``hpcrl.plan.bundle``) once, atomically, beside the run folders.

The folder is named by the hash of its contents, so an existing one already holds exactly
these files and is reused. A new one is copied into a temporary sibling and renamed into
place: two renders racing each write their own copy, one rename wins, the other copy is
removed, and a reader never sees half a bundle. Files are read-only (as far as the umask
lets others read them at all); the job only reads them.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from hpcrl.plan.bundle import BundleContents, collect_bundle
from hpcrl.run.atomic_files import current_umask, make_folders, no_space_or
from hpcrl.run.jobspec import CodeBundle

MANIFEST_NAME = "BUNDLE.json"


class BundleChanged(RuntimeError):
    """hpcrl's files changed between planning and writing the bundle (e.g. a pip install
    meanwhile): the plan names a bundle that this environment no longer produces."""


def write_bundle(bundle: CodeBundle) -> Path:
    """The bundle's folder, written now unless it exists; raises BundleChanged."""
    target = Path(bundle.path)
    if (target / MANIFEST_NAME).is_file():
        return target
    contents = collect_bundle(bundle.extra_packages)
    if contents.digest != bundle.digest:
        raise BundleChanged(
            f"the code bundle planned as {bundle.digest} is now {contents.digest}: hpcrl or "
            f"one of {', '.join(name for name, _ in bundle.packages)} changed on disk while "
            "the job was rendered; render it again"
        )
    created = make_folders(target.parent)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        _fill(staging, contents, bundle)
        _publish(staging, target)
    except OSError as error:
        shutil.rmtree(created[0] if created else staging, ignore_errors=True)
        raise no_space_or(error, target.parent) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already when the rename won
    return target


def _fill(folder: Path, contents: BundleContents, bundle: CodeBundle) -> None:
    for relative, source in contents.files:
        destination = folder / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, destination)
    for relative, text in contents.generated:
        destination = folder / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_text(text)
    manifest = {
        "digest": bundle.digest,
        "packages": dict(bundle.packages),
        "built_from": bundle.built_from,
        "built_with_python": sys.version.split()[0],
        "written_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n")
    umask = current_umask()  # modes the umask allows, never wider (hpcrl.run.atomic_files)
    for directory, _, names in os.walk(folder):
        os.chmod(directory, 0o777 & ~umask)  # mkdtemp made the top 0700
        for name in names:
            os.chmod(os.path.join(directory, name), 0o444 & ~umask)  # the job only reads them


def _publish(staging: Path, target: Path) -> None:
    try:
        os.rename(staging, target)
    except OSError:
        # Another render renamed the same contents into place first: theirs is as good.
        if not (target / MANIFEST_NAME).is_file():
            raise
