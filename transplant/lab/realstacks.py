"""The real seed stacks as recorded facts (edge, for tests and benchmarks).

``scripts/real-stacks`` installs the two venvs of the seed story from the registry (see
its header). This module records what ``plan`` reads of them: for each scenario (the
forward migration, its reverse, and the forward one after a real apply) the manifest, both
probe documents and both ELF reports, so the pure planner runs on them in the normal suite
in seconds, with no 22 GB of venvs. A fixture file is one gzip-compressed JSON document:
``{"schema": "transplant.real-facts/1", "scenario", "recorded", "manifest", "donor",
"target", "donor_elf", "target_elf"}``.

Usage: ``python -m transplant.lab.realstacks record ROOT OUT_DIR [--after TARGET_VENV]``
where ROOT holds ``donor`` and ``target`` venvs, and ``--after`` names a venv the calibrated
forward manifest was applied to (its own clone of the target, never the cached one);
``python -m transplant.lab.realstacks manifest DONOR TARGET OUT.yaml [--calibrated]`` writes
the calibration manifest.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from transplant.core.elf_facts import ELF_SCHEMA, ElfReport, parse_elf_report
from transplant.core.inventory import Inventory, expanded, parse_inventory
from transplant.core.manifest import Endpoint, Manifest, parse_manifest

__all__ = ["SCHEMA", "OVERLAY", "REVERSE_OVERLAY", "REMOVE", "CALIBRATED_OVERLAY", "CALIBRATED_REMOVE", "SERVER_ARGS", "scenario_manifest", "elf_document", "record",
           "load", "Recorded", "trim", "untrim", "manifest_data"]

SCHEMA = "transplant.real-facts/1"
#: The overlay of the seed story (manifests/seed-migration.yaml) on the registry's package names.
OVERLAY = ["torch", "triton", "torchvision", "nvidia-*", "sglang-kernel", "sglang", "flashinfer-python"]
#: The reverse direction (the 0.5.9 stack as donor) names its kernel package by its old name.
REVERSE_OVERLAY = [("sgl-kernel" if n == "sglang-kernel" else n) for n in OVERLAY]
#: The target's CUDA 12 libraries go, as in the seed manifest.
REMOVE = ["nvidia-*-cu12"]
#: The overlay after following the forward plan's own hints until no error was left (five plans,
#: 2026-12-01; ``transplant init`` and overlay closures are to make this loop the tool's job):
#: the story's names plus sglang 0.5.23's requirements the target lacked or had at other versions.
CALIBRATED_OVERLAY = OVERLAY + [
    "torch-memory-saver", "torchaudio", "torchcodec", "cuda-tile", "nccl-extensions", "nccl4py",
    "quack-kernels", "apache-tvm-ffi", "compressed-tensors", "cuda-python", "deepseek-recipe", "easydict",
    "flash-attn-4", "humming-kernels", "kernels", "llguidance", "mistral-common", "numba", "nvshmem4py-cu13",
    "openai", "python-dateutil", "sentencepiece", "sgl-deep-ep", "sgl-deep-gemm", "sgl-flash-mla",
    "smg-grpc-servicer", "tilelang", "timm", "tml-renderers", "tokenizers", "transformers", "watchfiles",
    "xgrammar", "zstandard", "cuda-bindings", "cuda-toolkit", "setuptools", "cuda-core", "huggingface-hub",
    "kernels-data", "tomlkit", "numpy", "pydantic-extra-types", "llvmlite", "cython", "six", "ml-dtypes",
    "z3-solver", "typer", "rich", "shellingham", "markdown-it-py", "mdurl",
]
#: ... and the target's distributions those hints remove: the CUDA 12 libraries, the renamed kernel
#: package, and what the donor runs without (flashinfer 0.6.3's cubin, torchao 0.9.0 built for torch 2.9).
CALIBRATED_REMOVE = REMOVE + ["sgl-kernel", "torchao", "flashinfer-cubin"]
#: The story's DFLASH check, without ``--mamba-scheduler-strategy`` (not in stock sglang 0.5.23).
SERVER_ARGS = {
    "entry": "sglang.srt.server_args:prepare_server_args",
    "args": ["--model-path", "/dev/shm/Qwen3.6-27B", "--port", "30001", "--host", "0.0.0.0", "--tp-size", "1",
             "--mem-fraction-static", "0.75", "--context-length", "32768", "--max-running-requests", "4",
             "--mamba-full-memory-ratio", "0.5", "--speculative-algorithm", "DFLASH",
             "--speculative-draft-model-path", "/root/models/Qwen3.6-27B-DFlash",
             "--speculative-dflash-block-size", "16"],
    "expect": {"speculative_algorithm": "DFLASH", "speculative_dflash_block_size": 16,
               "model_path": "/dev/shm/Qwen3.6-27B"},
}


def manifest_data(donor: str, target: str, *, overlay: list[str] | None = None,
                  remove: list[str] | None = None) -> dict[str, Any]:
    """The calibration manifest between two local venvs (absolute paths) as YAML-ready data:
    the story's :data:`OVERLAY` and :data:`REMOVE` unless given (:data:`CALIBRATED_OVERLAY`
    and :data:`CALIBRATED_REMOVE` follow the plan's own hints), and the story's verify."""
    return {"version": 1, "donor": {"host": "local", "venv": donor}, "target": {"host": "local", "venv": target},
            "overlay": list(OVERLAY if overlay is None else overlay), "remove": list(REMOVE if remove is None else remove),
            "verify": {"imports": ["torch", "sglang", "flashinfer", "sgl_kernel"], "server_args": SERVER_ARGS}}


def scenario_manifest(donor: str, target: str, *, overlay: list[str] | None = None,
                      remove: list[str] | None = None, path: str = "real.yaml") -> Manifest:
    """:func:`manifest_data`, parsed."""
    return parse_manifest(manifest_data(donor, target, overlay=overlay, remove=remove), path=path)


def elf_document(report: ElfReport) -> dict[str, Any]:
    """The ``transplant.elf/1`` document :func:`transplant.core.elf_facts.parse_elf_report` reads back
    into ``report`` (its inverse)."""
    files = {}
    for rel, f in report.files.items():
        item = {k: v for k, v in dataclasses.asdict(f).items() if k != "path" and v not in (None, (), {}, [])}
        files[rel] = item
    doc: dict[str, Any] = {"schema": ELF_SCHEMA, "files": files, "defined": dict(report.defined),
                           "defined_in": list(report.defined_in), "seconds": report.seconds}
    if report.defined_by:
        doc["defined_by"] = {k: None if v is None else list(v) for k, v in report.defined_by.items()}
    if report.libstdcxx is not None:
        doc["libstdcxx"] = {"path": report.libstdcxx.path, "versions": list(report.libstdcxx.versions)}
    return json.loads(json.dumps(doc))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recorded:
    """One recorded scenario, parsed: what :func:`transplant.core.planner.plan` takes."""

    scenario: str
    manifest: Manifest
    donor: Inventory
    target: Inventory
    donor_elf: ElfReport
    target_elf: ElfReport


def load(path: Path) -> Recorded:
    """Read a fixture written by :func:`record`.

    :raises ValueError: the file is not a ``transplant.real-facts/1`` document.
    """
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        doc = json.load(handle)
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a {SCHEMA} document")
    m = doc["manifest"]
    return Recorded(
        scenario=doc["scenario"],
        manifest=parse_manifest(m["data"], path=m["path"]),
        donor=parse_inventory(untrim(doc["donor"]), label=doc["labels"]["donor"]),
        target=parse_inventory(untrim(doc["target"]), label=doc["labels"]["target"]),
        donor_elf=parse_elf_report(doc["donor_elf"], label=doc["labels"]["donor"]),
        target_elf=parse_elf_report(doc["target_elf"], label=doc["labels"]["target"]),
    )


#: Characters of a sha256 kept in a fixture (after ``sha256=``): 96 bits, ample to tell apart
#: the ~110,000 files of the two stacks; the planner only compares hashes for equality.
HASH_CHARS = 16
_DROP = ("mtime", "mode")


def _map_entries(document: Mapping[str, Any], entry: Callable[[Mapping[str, Any]], dict[str, Any]]) -> dict[str, Any]:
    """A copy of a probe document with ``entry`` applied to every file entry (RECORD rows and
    the extra ``files``); a compact document (``record_columns``) is expanded first."""
    doc = expanded(json.loads(json.dumps(dict(document))))
    for d in doc["distributions"]:
        if d.get("record") is not None:
            d["record"] = [entry(e) for e in d["record"]]
    doc["files"] = {k: entry(v) for k, v in doc.get("files", {}).items()}
    return doc


def trim(document: Mapping[str, Any]) -> dict[str, Any]:
    """A probe document made compact for a fixture: file hashes shortened to
    :data:`HASH_CHARS`, a disk hash equal to RECORD's written once (``"hash": "="``),
    likewise a size equal to RECORD's (``"size=": 1``), ``path`` left out where it is
    ``venv_path`` under site-packages, and the timestamps and
    modes no rule reads dropped. :func:`untrim` restores a document the parser reads."""
    site = document["paths"]["purelib"] + "/"

    def short(h: Any) -> Any:
        return h[:len("sha256=") + HASH_CHARS] if isinstance(h, str) and h.startswith("sha256=") else h

    def entry(e: Mapping[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in e.items() if k not in _DROP}
        for key in ("record_hash", "hash", "body_hash"):
            if key in out:
                out[key] = short(out[key])
        if "hash" in out and out["hash"] == out.get("record_hash"):
            out["hash"] = "="
        if "size" in out and out["size"] == out.get("record_size"):
            del out["size"]
            out["size="] = 1
        if out.get("venv_path") == site + str(out.get("path")):
            del out["path"]
        return out

    return _map_entries(document, entry)


def untrim(document: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`trim`, as far as the parser is concerned."""
    site = document["paths"]["purelib"] + "/"

    def entry(e: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(e)
        if out.get("hash") == "=":
            out["hash"] = out.get("record_hash")
        if out.pop("size=", None):
            out["size"] = out.get("record_size")
        if "path" not in out and isinstance(out.get("venv_path"), str) and out["venv_path"].startswith(site):
            out["path"] = out["venv_path"][len(site):]
        return out

    return _map_entries(document, entry)


def record(manifest: Manifest, scenario: str, out: Path) -> Path:
    """Gather the facts of ``manifest`` (two local venvs) as ``plan`` does and write them,
    compressed, to ``out/<scenario>.json.gz``; returns the file written.

    :raises HostError: a venv's python does not run.
    """
    from transplant.pipeline.gather import gather
    from transplant.hosts.host import LocalHost

    donor = manifest.donor
    assert isinstance(donor, Endpoint)  # two local venvs
    facts = gather(manifest, LocalHost(), LocalHost())
    doc = {"schema": SCHEMA, "scenario": scenario, "recorded": time.strftime("%Y-%m-%d"),
           "manifest": {"path": manifest.path, "data": manifest_data(
               donor.venv, manifest.target.venv, overlay=list(manifest.overlay), remove=list(manifest.remove))},
           "labels": {"donor": facts.donor.label, "target": facts.target.label},
           "donor": trim(facts.donor.document), "target": trim(facts.target.document),
           "donor_elf": elf_document(facts.donor_elf), "target_elf": elf_document(facts.target_elf)}
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{scenario}.json.gz"
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=9) as handle:
        json.dump(doc, handle, separators=(",", ":"), sort_keys=True)
    return path


_USAGE = ("usage: python -m transplant.lab.realstacks record ROOT OUT_DIR [--after VENV]\n"
          "       python -m transplant.lab.realstacks manifest DONOR TARGET OUT.yaml [--calibrated]")


def _main(argv: list[str]) -> int:
    if len(argv) >= 4 and argv[0] == "manifest":
        import yaml

        calibrated = "--calibrated" in argv[4:]
        data = manifest_data(argv[1], argv[2], overlay=CALIBRATED_OVERLAY if calibrated else None,
                             remove=CALIBRATED_REMOVE if calibrated else None)
        Path(argv[3]).write_text(yaml.safe_dump(data, sort_keys=False))
        return 0
    if len(argv) < 3 or argv[0] != "record":
        print(_USAGE, file=sys.stderr)
        return 64
    root, out = Path(argv[1]), Path(argv[2])
    donor, target = str(root / "donor"), str(root / "target")
    done = [record(scenario_manifest(donor, target), "forward", out),
            record(scenario_manifest(target, donor, overlay=REVERSE_OVERLAY, remove=[]), "reverse", out)]
    if len(argv) >= 5 and argv[3] == "--after":
        done.append(record(scenario_manifest(donor, argv[4], overlay=CALIBRATED_OVERLAY, remove=CALIBRATED_REMOVE),
                           "after-apply", out))
    for path in done:
        print(f"{path}: {path.stat().st_size / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
