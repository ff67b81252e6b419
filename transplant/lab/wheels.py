"""Build small real wheels with the standard library (PEP 427 layout, PEP 376 RECORD).

Used by the demo for its stand-in wheels (a real distribution name and CUDA label where
no registry has such a build) and by the tests for their fixtures.
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from transplant.remote._common import record_hash  # RECORD's hash form, one definition

__all__ = ["build_wheel", "make_venv"]


_digest = record_hash


def build_wheel(
    out: Path,
    name: str,
    version: str,
    files: Mapping[str, str | bytes],
    *,
    requires: tuple[str, ...] = (),
    tag: str = "py3-none-any",
    summary: str = "test wheel",
    entry_points: str | None = None,
    executable: tuple[str, ...] = (),
) -> Path:
    """Write ``<name>-<version>-<tag>.whl`` into ``out`` and return its path.

    :param files: archive path -> content (text is UTF-8 encoded).
    :param requires: Requires-Dist lines; :param tag: the WHEEL tag.
    :param executable: archive paths stored with mode 0755 (pip keeps the executable bit, as
        for the ``ptxas`` a triton wheel carries).
    """
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    metadata = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", f"Summary: {summary}"]
    metadata += [f"Requires-Dist: {r}" for r in requires]
    contents: dict[str, bytes] = {k: v.encode() if isinstance(v, str) else v for k, v in files.items()}
    contents[f"{info}/METADATA"] = ("\n".join(metadata) + "\n").encode()
    contents[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: transplant-tests\nRoot-Is-Purelib: "
                                 f"{'true' if tag.endswith('any') else 'false'}\nTag: {tag}\n").encode()
    if entry_points:
        contents[f"{info}/entry_points.txt"] = entry_points.encode()
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for path, data in contents.items():
        writer.writerow([path, _digest(data), len(data)])
    writer.writerow([f"{info}/RECORD", "", ""])
    contents[f"{info}/RECORD"] = record.getvalue().encode()
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in contents.items():
            if path in executable:
                entry = zipfile.ZipInfo(path)
                entry.external_attr = 0o100755 << 16
                zf.writestr(entry, data)
            else:
                zf.writestr(path, data)
    return wheel


def make_venv(path: Path, wheels: Sequence[Path] = (), python: str = sys.executable) -> Path:
    """Create a venv at ``path`` (without pip, which is slow to bootstrap) and install
    ``wheels`` into its site-packages offline, without dependencies, using ``python``'s pip.

    :raises subprocess.CalledProcessError: venv creation or pip failed.
    """
    base = getattr(sys, "_base_executable", python)
    subprocess.run([base, "-m", "venv", "--without-pip", str(path)], check=True)
    if wheels:
        minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
        subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                        "--target", str(path / "lib" / minor / "site-packages"), *map(str, wheels)], check=True)
    return path
