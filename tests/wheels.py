"""Build small real wheels with the standard library, and venvs to install them into."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import subprocess
import sys
import zipfile
from pathlib import Path


def _digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(
    out: Path,
    name: str,
    version: str,
    files: dict[str, str | bytes],
    *,
    requires: tuple[str, ...] = (),
    tag: str = "py3-none-any",
    summary: str = "test wheel",
    entry_points: str | None = None,
) -> Path:
    """Write ``<name>-<version>-<tag>.whl`` into ``out`` and return its path (PEP 427 layout)."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    metadata = [f"Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", f"Summary: {summary}"]
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
            zf.writestr(path, data)
    return wheel


def make_venv(path: Path, wheels: list[Path] = (), python: str = sys.executable) -> Path:
    """Create a venv at ``path`` (without pip's own upgrade) and install ``wheels`` offline."""
    base = getattr(sys, "_base_executable", python)
    subprocess.run([base, "-m", "venv", str(path)], check=True)
    if wheels:
        subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                        "--disable-pip-version-check", *map(str, wheels)], check=True)
    return path
