"""Build probe documents (schema transplant.inventory/1) as plain data for pure-core tests."""

from __future__ import annotations

import base64
import hashlib
from typing import Any

SITE = "lib/python3.11/site-packages"


def digest(text: str) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()


def dist(name: str, version: str, files: dict[str, str], *, requires: list[str] | None = None,
         tags: list[str] | None = None, hashed: bool = True, dist_info: str | None = None,
         metadata: bool = True, on_disk: dict[str, str] | None = None, scripts: dict[str, str] | None = None,
         direct_url: dict | None = None, script_rows: dict[str, str] | None = None,
         record_identity: str | None = None) -> dict[str, Any]:
    """One distribution entry; ``files`` maps site-packages-relative paths to their text.

    ``on_disk`` overrides what the disk holds for some of them (RECORD keeps ``files``'
    hash); ``scripts`` maps console script names to their text (``bin/<name>``), and
    ``script_rows`` overrides the text RECORD's row hashes for some of them; ``record_identity``
    is what the probe reports for the RECORD itself (hashed only).
    """
    folder = dist_info or f"{name.replace('-', '_')}-{version}.dist-info"
    record = []
    for rel, text in sorted(files.items()):
        disk = (on_disk or {}).get(rel, text)
        entry = {"path": rel, "venv_path": f"{SITE}/{rel}", "record_hash": digest(text),
                 "record_size": len(text.encode()), "exists": True, "mode": 0o644, "size": len(disk.encode())}
        if hashed:
            entry["hash"] = digest(disk)
        record.append(entry)
    for script, text in sorted((scripts or {}).items()):
        row = (script_rows or {}).get(script, text)
        entry = {"path": f"../../../bin/{script}", "venv_path": f"bin/{script}", "record_hash": digest(row),
                 "record_size": len(row.encode()), "exists": True, "mode": 0o755, "size": len(text.encode())}
        if hashed:
            head, _, body = text.partition("\n")
            entry.update(hash=digest(text), head=head + "\n", body_hash=digest(body))
        record.append(entry)
    record.append({"path": f"{folder}/RECORD", "venv_path": f"{SITE}/{folder}/RECORD", "record_hash": None,
                   "record_size": None, "exists": True, "mode": 0o644, "size": 100,
                   **({"hash": digest(name + version + "RECORD")} if hashed else {}),
                   **({"record_identity": record_identity} if hashed and record_identity else {})})
    return {"name": name, "version": version, "dist_info": folder, "site_packages": SITE,
            "metadata_present": metadata, "summary": None, "requires_python": None,
            "requires_dist": requires or [], "installer": "pip", "requested": True, "direct_url": direct_url,
            "wheel": {"generator": "test", "root_is_purelib": False, "tags": tags or ["py3-none-any"]},
            "top_level": [name.split("-")[0]], "entry_points": None, "hashed": hashed, "record": record,
            "listing": sorted({r["path"].split("/", 1)[1] for r in record if r["path"].startswith(folder + "/")})}


def document(prefix: str, dists: list[dict[str, Any]], *, python: str = "3.11.7", hostname: str = "host",
             files: dict[str, Any] | None = None, nvidia: dict[str, Any] | None = None, glibc: str = "2.36",
             home_exists: bool = True, texts: dict[str, str] | None = None,
             elsewhere: dict[str, bool] | None = None, machine: str = "x86_64") -> dict[str, Any]:
    """A whole probe document for a venv at ``prefix``; ``texts`` are site-packages-relative."""
    minor = ".".join(python.split(".")[:2])
    markers = {"implementation_name": "cpython", "implementation_version": python, "os_name": "posix",
               "platform_machine": machine, "platform_release": "6.1", "platform_system": "Linux",
               "platform_version": "#1", "python_full_version": python,
               "platform_python_implementation": "CPython", "python_version": minor, "sys_platform": "linux"}
    tag = "cp" + minor.replace(".", "")
    return {
        "schema": "transplant.inventory/1",
        "host": {"hostname": hostname, "machine": machine,
                 "nvidia": nvidia or {"available": False, "reason": "no nvidia-smi on PATH"}},
        "interpreter": {"executable": f"{prefix}/bin/python", "prefix": prefix, "base_prefix": "/usr",
                        "version": python, "implementation": "cpython", "cache_tag": f"cpython-{tag[2:]}",
                        "soabi": f"cpython-{tag[2:]}-{machine}-linux-gnu",
                        "ext_suffix": f".cpython-{tag[2:]}-{machine}-linux-gnu.so", "abi_tag": tag,
                        "machine": machine, "glibc": glibc, "pyvenv_cfg": {"home": "/usr/bin"},
                        "home_exists": home_exists, "markers": markers},
        "paths": {"prefix": prefix, "purelib": SITE, "platlib": SITE, "scripts": "bin"},
        "distributions": dists,
        "files": files or {},
        "texts": {f"{SITE}/{k}": v for k, v in (texts or {}).items()},
        "elsewhere": elsewhere or {},
        "probe_seconds": 0.1,
    }
