"""Verify stage ``smoke``: torch on the device against a float64 CPU reference.

Usage: ``<venv>/bin/python - DEVICE < stage_smoke.py`` with DEVICE ``cpu``, ``cuda`` or
``auto``. Runs a 256x256 matmul in float32 and bfloat16 and a two-layer MLP forward
(256 -> 512 -> 256, GELU) in float32, each compared with the same computation in float64
on the CPU by the relative Frobenius error ``||out - ref|| / ||ref||``. Bounds, per
dtype: float32 1e-4 (about 100x its unit round-off 6e-8 times sqrt(K) growth, TF32 off),
bfloat16 2e-2 (its unit round-off is 3.9e-3; K=256 accumulation in float32).
Prints ``{"ok", "device", "reason", "torch", "cuda", "checks": [{"name", "dtype",
"rel_error", "bound", "ok"}]}``. Stdlib only apart from torch, which it tests.
"""

import json
import sys

BOUNDS = {"float32": 1e-4, "bfloat16": 2e-2}


def _report(**fields):
    sys.stdout.write(json.dumps(fields) + "\n")
    return 0


def main(argv):
    want = argv[0] if argv else "auto"
    try:
        import torch
    except BaseException as exc:  # noqa: BLE001
        return _report(ok=False, device=None, reason="import torch failed: {}: {}".format(type(exc).__name__, exc),
                       torch=None, cuda=None, checks=[])
    cuda_ok = bool(torch.cuda.is_available())
    info = {"torch": torch.__version__, "cuda": getattr(torch.version, "cuda", None)}
    if want == "cuda" and not cuda_ok:
        return _report(ok=False, device=None, checks=[],
                       reason="device cuda asked for, but torch.cuda.is_available() is False "
                              "(torch {}, built for CUDA {})".format(torch.__version__, info["cuda"]), **info)
    device = "cuda" if (want == "cuda" or (want == "auto" and cuda_ok)) else "cpu"
    reason = "ran on {}".format(device)
    if want == "auto" and not cuda_ok:
        reason = "no CUDA device visible (torch.cuda.is_available() is False); ran on the CPU"
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        reason += " ({})".format(torch.cuda.get_device_name(0))
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(256, 256, generator=gen, dtype=torch.float64)
    b = torch.randn(256, 256, generator=gen, dtype=torch.float64)
    checks = []

    def check(name, dtype_name, out, ref):
        err = float(torch.linalg.norm(out.double().cpu() - ref) / torch.linalg.norm(ref))
        bound = BOUNDS[dtype_name]
        checks.append({"name": name, "dtype": dtype_name, "rel_error": err, "bound": bound, "ok": err <= bound})

    ref = a @ b
    for dtype_name in ("float32", "bfloat16"):
        dtype = getattr(torch, dtype_name)
        out = a.to(device=device, dtype=dtype) @ b.to(device=device, dtype=dtype)
        check("matmul 256x256", dtype_name, out, ref)
    w1 = torch.randn(512, 256, generator=gen, dtype=torch.float64) / 16
    w2 = torch.randn(256, 512, generator=gen, dtype=torch.float64) / 22
    x = torch.randn(32, 256, generator=gen, dtype=torch.float64)
    mlp_ref = torch.nn.functional.gelu(x @ w1.T) @ w2.T
    f32 = dict(device=device, dtype=torch.float32)
    mlp = torch.nn.functional.gelu(x.to(**f32) @ w1.to(**f32).T) @ w2.to(**f32).T
    check("mlp 256-512-256 forward", "float32", mlp, mlp_ref)
    if device == "cuda":
        torch.cuda.synchronize()
    return _report(ok=all(c["ok"] for c in checks), device=device, reason=reason, checks=checks, **info)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
