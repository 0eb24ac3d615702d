"""Build ``.whl/``: the wheels the GPU test machine lacks for hpcrl's job and ``tests/gpu``.

The machine (../shared/notes/gpu-machine.md; the device README) has Python 3.12, torch 2.11
(CUDA 13), transformers 5.17, numpy, jinja2, attrs, rich, psutil, pyyaml, pytest and
matplotlib, and no network. Everything else the job imports travels in the working tree,
which may carry at most 64 MiB per call, repository included. So:

- one version of each package (two would stop the install there), cp312 manylinux wheels;
- ray's 79 MB wheel slimmed to what the job side uses (no Java jars, no rllib/serve/tune/
  train/data/llm/air libraries, no dashboard web client), re-zipped with its RECORD rewritten
  and every file's mode kept (raylet and gcs_server stay executable);
- omegaconf 2.4 carries its own antlr4 runtime (2.3 needed antlr4-python3-runtime 4.9.3, which
  has only a source release);
- megatron-bridge 0.6.2 without its declared dependencies (Transformer Engine, wandb, mlflow,
  diffusers, ...: docs/megatron.md says which of them a Llama/Qwen2 conversion imports);
- hpcrl itself, built from this checkout.

    python3 tests/gpu/make_wheelhouse.py      # needs PyPI; prints each wheel and the total

The total printed is what a device call sends: the wheels plus the repository's tracked and
untracked-not-ignored files. It fails above 64 MiB.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WHEELHOUSE = REPO / ".whl"
SEND_LIMIT_BYTES = 64 * 2**20
PLATFORMS = (
    "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64",
)  # fmt: skip

#: (requirement, who needs it). Pinned (the GPU machine cannot resolve anything), the versions
#: the CI environment (.venv) tests with where a package is in both.
WHEELS = (
    ("ray==2.60.0", "hpcrl's job (one Ray cluster per job); slimmed below"),
    ("jsonschema==4.26.0", "ray"),
    ("jsonschema-specifications==2025.9.1", "jsonschema"),
    ("referencing==0.37.0", "jsonschema"),
    ("rpds-py==2026.9.1", "referencing"),
    ("submitit==1.5.4", "hpcrl (pinned: its private script hook)"),
    ("cattrs==26.2.1", "hpcrl's config converter"),
    # 2.4 vendors its antlr4 runtime: no antlr4-python3-runtime wheel to build (2.3 needed one)
    ("omegaconf==2.4.0", "hpcrl's recipe loading, megatron-bridge"),
    ("megatron-core==0.19.2", "the Megatron backend"),
    # Installed without its declared dependencies: importing AutoBridge and a Llama/Qwen2
    # conversion, refit and export need only omegaconf beyond the machine's packages (plus
    # hpcrl's Transformer Engine and ModelOpt placeholders, bridge_compat.py).
    ("megatron-bridge==0.6.2", "the Megatron backend's HF conversion, refit and export"),
)

#: Parts of ray's wheel the job never imports (paths inside the wheel).
RAY_UNUSED_PREFIXES = tuple(
    f"ray/{part}/"
    for part in (
        "jars", "rllib", "serve", "tune", "train", "data", "llm", "air", "dashboard/client",
    )
)  # fmt: skip


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", *args], check=True)


def download(requirement: str, dest: Path) -> None:
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    pip("download", "-q", "--no-deps", "--only-binary=:all:", "--python-version", "3.12",
        "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none",
        *platforms, "-d", str(dest), requirement)  # fmt: skip


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def slim_wheel(source: Path, dest: Path, unused_prefixes: tuple[str, ...]) -> tuple[int, int]:
    """Copy ``source`` without the members under ``unused_prefixes``; RECORD lists exactly
    what is left. Returns (members dropped, members kept)."""
    dropped = kept = 0
    with (
        zipfile.ZipFile(source) as wheel_in,
        zipfile.ZipFile(dest, "w", compression=zipfile.ZIP_DEFLATED) as wheel_out,
    ):
        record_name = next(n for n in wheel_in.namelist() if n.endswith(".dist-info/RECORD"))
        lines = []
        for info in wheel_in.infolist():
            if info.filename.startswith(unused_prefixes):
                dropped += 1
                continue
            if info.filename == record_name:
                continue
            data = wheel_in.read(info)
            # the ZipInfo carries the file mode (external_attr): executables stay executable
            wheel_out.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
            lines.append(_record_line(info.filename, data))
            kept += 1
        lines.append(f"{record_name},,")
        record_info = wheel_in.getinfo(record_name)
        wheel_out.writestr(record_info, "\n".join(lines) + "\n")
    return dropped, kept


def build_hpcrl(dest: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        # build from a copy of the tracked tree: no .venv, runs or caches go into the wheel
        tree = Path(tmp) / "src"
        files = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"],
            cwd=REPO, capture_output=True, check=True,
        ).stdout.decode().split("\0")  # fmt: skip
        for name in filter(None, files):
            if (REPO / name).is_file():
                (tree / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, tree / name)
        pip("wheel", "-q", "--no-deps", "-w", str(dest), str(tree))


def sent_bytes(wheelhouse: Path) -> tuple[int, int]:
    """(repository bytes, wheel bytes) that a device call sends (carry: .whl)."""
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=REPO, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    repo = sum((REPO / n).stat().st_size for n in filter(None, files) if (REPO / n).is_file())
    wheels = sum(p.stat().st_size for p in wheelhouse.glob("*.whl"))
    return repo, wheels


def check_one_version_each(wheelhouse: Path) -> None:
    names: dict[str, list[str]] = {}
    for wheel in wheelhouse.glob("*.whl"):
        names.setdefault(wheel.name.split("-")[0].lower().replace("_", "-"), []).append(wheel.name)
    twice = {name: found for name, found in names.items() if len(found) > 1}
    assert not twice, f"two versions of a package would stop the install there: {twice}"


def build(wheelhouse: Path) -> None:
    shutil.rmtree(wheelhouse, ignore_errors=True)
    wheelhouse.mkdir()
    with tempfile.TemporaryDirectory() as tmp:
        for requirement, _why in WHEELS:
            download(requirement, Path(tmp) if requirement.startswith("ray==") else wheelhouse)
        (ray_wheel,) = Path(tmp).glob("ray-*.whl")
        dropped, kept = slim_wheel(ray_wheel, wheelhouse / ray_wheel.name, RAY_UNUSED_PREFIXES)
        print(f"ray: {ray_wheel.stat().st_size / 2**20:.1f} MiB -> "
              f"{(wheelhouse / ray_wheel.name).stat().st_size / 2**20:.1f} MiB "
              f"({dropped} files dropped, {kept} kept)")  # fmt: skip
    build_hpcrl(wheelhouse)
    check_one_version_each(wheelhouse)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only measure an existing .whl/")
    args = parser.parse_args()
    if not args.check:
        build(WHEELHOUSE)
    for wheel in sorted(WHEELHOUSE.glob("*.whl")):
        print(f"{wheel.stat().st_size / 2**20:8.2f} MiB  {wheel.name}")
    repo, wheels = sent_bytes(WHEELHOUSE)
    total = repo + wheels
    print(f"sent per device call: repository {repo / 2**20:.1f} MiB + wheels "
          f"{wheels / 2**20:.1f} MiB = {total / 2**20:.1f} MiB of {SEND_LIMIT_BYTES / 2**20:.0f}")  # fmt: skip
    if total > SEND_LIMIT_BYTES:
        print("too large for one device call: drop or slim wheels", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
