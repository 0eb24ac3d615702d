"""The GPU machine's wheelhouse (make_wheelhouse.py) and run script (device_run.sh), checked
here on CPU: a mistake in them costs a device call."""

from __future__ import annotations

import base64
import hashlib
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.gpu import make_wheelhouse

HERE = Path(__file__).parent
DIST_INFO = "fake-1.0.dist-info"


def _fake_wheel(path: Path) -> None:
    """A minimal valid wheel with an executable, a 'jar' and a record, like ray's."""
    files = {
        "fake/__init__.py": (b"VALUE = 1\n", 0o644),
        "fake/core/server": (b"\x7fELF pretend binary", 0o755),
        "fake/jars/big.jar": (b"java" * 100, 0o644),
        f"{DIST_INFO}/METADATA": (b"Metadata-Version: 2.1\nName: fake\nVersion: 1.0\n", 0o644),
        f"{DIST_INFO}/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
            0o644,
        ),
    }
    with zipfile.ZipFile(path, "w") as wheel:
        record = []
        for name, (data, mode) in files.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (stat.S_IFREG | mode) << 16
            wheel.writestr(info, data)
            record.append(f"{name},,")
        wheel.writestr(f"{DIST_INFO}/RECORD", "\n".join(record) + f"\n{DIST_INFO}/RECORD,,\n")


def test_slimmed_wheel_installs_without_the_dropped_parts_and_keeps_modes(tmp_path: Path) -> None:
    source, slim = (
        tmp_path / "src" / "fake-1.0-py3-none-any.whl",
        tmp_path / "fake-1.0-py3-none-any.whl",
    )
    source.parent.mkdir()
    _fake_wheel(source)
    dropped, kept = make_wheelhouse.slim_wheel(source, slim, ("fake/jars/",))
    assert (dropped, kept) == (1, 4)  # RECORD is written anew, not counted

    with zipfile.ZipFile(slim) as wheel:
        record = wheel.read(f"{DIST_INFO}/RECORD").decode().splitlines()
        for line in record[:-1]:
            name, digest, size = line.split(",")
            data = wheel.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            assert digest == f"sha256={expected.decode()}" and int(size) == len(data), line
        assert sorted(line.split(",")[0] for line in record) == sorted(wheel.namelist())
    assert "fake/jars/big.jar" not in "\n".join(record)

    # the device installs exactly so (its README's command)
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
         "--target", str(target), str(slim)],
        check=True,
    )  # fmt: skip
    assert (target / "fake" / "__init__.py").is_file()
    assert not (target / "fake" / "jars").exists()
    assert (target / "fake" / "core" / "server").stat().st_mode & 0o111, "lost its exec bit"


def test_two_versions_of_a_package_are_refused(tmp_path: Path) -> None:
    for name in ("cattrs-26.2.1-py3-none-any.whl", "cattrs-25.1.0-py3-none-any.whl"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "rpds_py-2026.9.1-cp312-cp312-manylinux_2_17_x86_64.whl").write_bytes(b"")
    with pytest.raises(AssertionError, match="cattrs"):
        make_wheelhouse.check_one_version_each(tmp_path)


def test_wheel_list_pins_one_version_of_each_package() -> None:
    names = [requirement.split("==")[0] for requirement, _ in make_wheelhouse.WHEELS]
    assert all("==" in requirement for requirement, _ in make_wheelhouse.WHEELS)
    assert len(names) == len(set(names))


def test_device_script_is_valid_bash_and_fits_one_call() -> None:
    script = HERE / "device_run.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "HPCRL_REQUIRE_GPU=1" in text and "--target /tmp/site" in text
    # the device command is `bash tests/gpu/device_run.sh` (far below its 2,000 characters)
    assert "cd /tmp" in text, "pytest must not run from the checkout's root"
