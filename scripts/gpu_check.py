"""The verify ladder on a machine with one CUDA GPU (run by ``scripts/gpu-check VENV``).

Meant for a GPU host with torch 2.11 (cu130) in VENV and no network. It runs every stage of
``transplant verify`` on the local venv, with no manifest and no donor, and prints the table:

1. interpreter: VENV's pyvenv.cfg home exists (no donor: the version is shown, not compared).
2. imports: the import names of the installed torch, triton, nvidia-*, sgl-kernel /
   sglang-kernel, sglang and flashinfer-* distributions (top_level.txt / RECORD), each with
   its version and file.
3. native-load: every shared object of those distributions dlopen()s with RTLD_NOW after
   ``import torch`` (here libcuda.so.1 must be found: a GPU host has the driver).
4. library-provenance: after importing them, no CUDA/torch library (libcudart, libcublas,
   libcublasLt, libnvrtc, libtorch*...) was mapped from outside VENV while VENV ships it.
5. requirements: every Requires-Dist of VENV is met (no donor: every unmet one fails).
6. server-args (when sglang is installed): sglang's prepare_server_args with
   ``--model-path <tiny model>``, then ``server-args-resolve``: ServerArgs.resolve_once()
   against the tiny model's config.json on this GPU.
7. smoke: device ``cuda`` (a missing GPU fails): float32 / bfloat16 matmul and an MLP forward
   against float64 CPU references; a triton kernel; sgl_kernel's and flashinfer's rmsnorm
   against torch, where installed.
8. serve (when sglang is installed): ``python -m sglang.launch_server`` with the tiny model
   (two-layer Llama config.json, zero bfloat16 weights), ``--skip-tokenizer-init``, one
   /generate request with four token ids, four new tokens; startup and first-answer seconds.
9. jit-caches: the triton, flashinfer and torch-inductor cache folders and the versions
   their contents were built for.

Exit 0 when no stage failed, 3 when one did. ``--json FILE`` / ``--junit FILE`` also write
the reports.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console

from transplant.hosts.host import HostSpec
from transplant.hosts.connecting import connect
from transplant.core.manifest import ServeCheck, ServerArgsCheck, VerifySettings
from transplant.hosts.probing import take_inventory
from transplant.cli.progress import Shown
from transplant.cli.render import stages_table, verify_json, verify_junit
from transplant.verify.judges import overall_ok
from transplant.verify.runner import run_stages

OVERLAY = ("torch", "triton", "nvidia-*", "sgl-kernel", "sglang-kernel", "sglang", "flashinfer-python",
           "flashinfer-cubin", "flashinfer-jit-cache")
SERVE = ("{python}", "-m", "sglang.launch_server", "--model-path", "{model}", "--port", "{port}", "--host", "127.0.0.1",
         "--skip-tokenizer-init", "--mem-fraction-static", "0.3", "--disable-cuda-graph")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("venv", help="absolute path of the CUDA venv to check")
    parser.add_argument("--json", metavar="FILE", help="also write the transplant.verify/2 document")
    parser.add_argument("--junit", metavar="FILE", help="also write JUnit XML")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per stage (default 900)")
    args = parser.parse_args(argv)
    venv = os.path.abspath(args.venv)
    console = Console(width=None if sys.stdout.isatty() else 200)
    with connect(HostSpec.parse("local")) as host:
        names = {d.name for d in take_inventory(host, venv, record=False).distributions}
        with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
            model = Path(tmp) / "tiny-model"
            _write_tiny_model(model)
            sglang = "sglang" in names
            settings = VerifySettings(
                overlay=OVERLAY, imports=("torch",) + (("sglang.srt.server_args",) if sglang else ()),
                smoke_device="cuda", timeout=args.timeout,
                server_args=ServerArgsCheck(entry="sglang.srt.server_args:prepare_server_args",
                                            args=("--model-path", str(model)), expect={"model_path": str(model)},
                                            resolve=True) if sglang else None,
                serve=ServeCheck(command=SERVE, timeout=args.timeout) if sglang else None)
            with console.status("verifying") as status:
                results = run_stages(settings, target=host, venv=venv,
                                     reporter=Shown(step=lambda name: status.update(f"gpu-check: {name}")))
    label = f"local:{venv}"
    console.print(stages_table(results, f"gpu-check {label}"))
    by = {r.name: r for r in results}
    smoke, interp = by["smoke"].details, by["interpreter"].details.get("target") or {}
    counts = {s: sum(r.status == s for r in results) for s in ("pass", "fail", "skip")}
    console.print(f"checked: python {interp.get('version')}, torch {smoke.get('torch')} (CUDA {smoke.get('cuda')}), "
                  f"smoke on {smoke.get('device')}: {smoke.get('reason')}; sglang {'installed' if sglang else 'absent'}; "
                  f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped",
                  markup=False, highlight=False)
    if args.json:
        Path(args.json).write_text(verify_json(results, label))
    if args.junit:
        Path(args.junit).write_text(verify_junit(results, label))
    return 0 if overall_ok(results) else 3


def _write_tiny_model(folder: Path) -> None:
    """The same tiny model the serve stage writes (config.json and zero weights), for the
    resolution step, which reads the model's config.json."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "stage_serve", Path(__file__).resolve().parent.parent / "transplant" / "remote" / "stage_serve.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    module.write_model(str(folder), module.TINY)


if __name__ == "__main__":
    sys.exit(main())
