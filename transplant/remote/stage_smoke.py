"""Verify stage ``smoke``: torch on the device against a float64 CPU reference.

Usage: ``<venv>/bin/python - DEVICE < stage_smoke.py`` with DEVICE ``cpu``, ``cuda`` or
``auto``. Runs a 256x256 matmul in float32 and bfloat16 and a two-layer MLP forward
(256 -> 512 -> 256, GELU) in float32, each compared with the same computation in float64
on the CPU by the relative Frobenius error ``||out - ref|| / ||ref||``. Bounds, per
dtype: float32 1e-4 (about 100x its unit round-off 6e-8 times sqrt(K) growth, TF32 off),
bfloat16 2e-2 (its unit round-off is 3.9e-3; K=256 accumulation in float32).
Then sub-checks, each ``pass``, ``fail`` or ``skip`` with its reason: where triton is present
and the host lacks the C compiler or ``Python.h`` its launcher build needs, a failure naming
the fact (GPU or not); where triton and a GPU are present, a tiny triton kernel (``out = x * 2 + y`` over 4096 float32 values, exact);
where sgl_kernel or flashinfer is importable and a GPU is present, its ``rmsnorm`` on a
16x256 bfloat16 input against the same formula in float64 (bound 2e-2, bfloat16's
round-off with headroom); without a GPU, or without the package, an honest skip; where numpy
is importable, a round trip through torch's NumPy bridge (``from_numpy``, ``Tensor.numpy``:
fails under a NumPy major the torch was not built for).

Prints ``{"ok", "device", "reason", "torch", "cuda", "unavailable"?, "checks": [{"name", "dtype",
"rel_error", "bound", "ok"}], "subchecks": [{"name", "status", "reason", "needs"?}]}`` (``unavailable``:
``"cuda"`` when that device was asked for and torch sees none; ``missing``: ``"torch"`` when
the venv has no torch). Stdlib only
apart from torch, triton, sgl_kernel, flashinfer and numpy, which it tests.
"""

import importlib.util
import json
import linecache
import sys

BOUNDS = {"float32": 1e-4, "bfloat16": 2e-2}


def _report(**fields):
    return fields


def main(argv):
    sys.stdout.write(json.dumps(report(argv)) + "\n")
    return 0


def report(argv):
    """The report ``main`` prints for ``argv`` (``[DEVICE]``), as a dict; also called in a child
    that ``stage_imports`` forks once it has imported torch."""
    want = argv[0] if argv else "auto"
    if importlib.util.find_spec("torch") is None:
        # no torch in this venv at all: nothing to smoke-test where the device was left to us
        # (auto); a device named in the manifest asks for the pass, and its absence fails it
        return _report(ok=False, skipped=want == "auto", missing="torch", device=None, torch=None, cuda=None, checks=[],
                       reason="torch is not installed in this venv; the smoke pass runs torch's matmuls and MLP"
                              + ("" if want == "auto" else ", and smoke: {{device: {}}} asks for it".format(want)))
    try:
        import torch
    except BaseException as exc:  # noqa: BLE001 - a failing import is the finding
        return _report(ok=False, device=None, reason="import torch failed: {}: {}".format(type(exc).__name__, exc),
                       torch=None, cuda=None, checks=[])
    cuda_ok = bool(torch.cuda.is_available())
    info = {"torch": torch.__version__, "cuda": getattr(torch.version, "cuda", None)}
    if want == "cuda" and not cuda_ok:
        return _report(ok=False, device=None, checks=[], unavailable="cuda",
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
    subchecks = [_triton(torch, device), _rmsnorm(torch, device, "sgl_kernel"), _rmsnorm(torch, device, "flashinfer"),
                 _numpy_bridge(torch)]
    ok = all(c["ok"] for c in checks) and not any(s["status"] == "fail" for s in subchecks)
    return _report(ok=ok, device=device, reason=reason, checks=checks, subchecks=subchecks, **info)


# triton reads a kernel's source with inspect, which finds it through linecache: the kernel is
# compiled from this text under a made-up file name registered there, so nothing is written.
_TRITON_KERNEL = """
import triton
import triton.language as tl


@triton.jit
def axpy(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + tl.load(y_ptr + offs, mask=mask), mask=mask)
"""


def _sub(name, status, reason, needs=None):
    # needs: "gpu" on a sub-check skipped for want of a CUDA device (a fact, not its text)
    out = {"name": name, "status": status, "reason": reason}
    if needs:
        out["needs"] = needs
    return out


def _launcher_toolchain():
    """Why triton's kernel launcher cannot be built here, or None: it is built at the first launch
    with ``CC``, else ``gcc``, else ``clang`` on PATH, and ``-I`` the interpreter's include folder
    (triton python/triton/runtime/build.py ``_build``; the probe's ``_c_toolchain`` reads the same)."""
    import os
    import shutil
    import sysconfig

    cc = os.environ.get("CC")
    lacking = []
    if cc is None and not (shutil.which("gcc") or shutil.which("clang")):
        lacking.append("no C compiler (CC is unset and neither gcc nor clang is on PATH)")
    elif cc is not None and not (cc.strip() and shutil.which(cc)):
        lacking.append("no C compiler (CC={!r} names nothing on PATH)".format(cc[:200]))
    scheme = sysconfig.get_default_scheme() if hasattr(sysconfig, "get_default_scheme") else \
        sysconfig._get_default_scheme()
    include = sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme).get("include")
    if not include or not os.path.isfile(os.path.join(include, "Python.h")):
        lacking.append("no Python.h in {}".format(include))
    if not lacking:
        return None
    return ("{}: triton builds its kernel launcher with them at the first launch, so every triton kernel "
            "fails here".format(" and ".join(lacking)))


def _triton(torch, device):
    name = "triton kernel"
    if importlib.util.find_spec("triton") is None:
        return _sub(name, "skip", "triton is not installed")
    # a host without what the launcher build needs is broken for triton with or without a GPU here
    broken = _launcher_toolchain()
    if broken:
        return _sub(name, "fail", broken)
    if device != "cuda":
        return _sub(name, "skip", "no GPU: a triton kernel needs one", needs="gpu")
    try:
        filename = "<transplant-smoke-triton>"
        linecache.cache[filename] = (len(_TRITON_KERNEL), None, _TRITON_KERNEL.splitlines(True), filename)
        space = {"__name__": "transplant_smoke_triton"}
        exec(compile(_TRITON_KERNEL, filename, "exec"), space)  # noqa: S102 - this file's own kernel text
        n = 4096
        x = torch.arange(n, dtype=torch.float32, device="cuda")
        y = torch.ones(n, dtype=torch.float32, device="cuda")
        out = torch.empty_like(x)
        space["axpy"][(n // 1024,)](x, y, out, n, BLOCK=1024)
        torch.cuda.synchronize()
        wrong = int((out != x * 2 + y).sum())
    except BaseException as exc:  # noqa: BLE001 - the failure is the finding
        return _sub(name, "fail", "{}: {}".format(type(exc).__name__, str(exc)[:500]))
    if wrong:
        return _sub(name, "fail", "x*2+y over 4096 float32 values: {} wrong".format(wrong))
    import triton
    return _sub(name, "pass", "triton {}: x*2+y over 4096 float32 values, exact".format(triton.__version__))


def _rmsnorm(torch, device, package):
    name = "{} rmsnorm".format(package)
    if importlib.util.find_spec(package) is None:
        return _sub(name, "skip", "{} is not installed".format(package))
    if device != "cuda":
        return _sub(name, "skip", "no GPU: {}'s kernels run on CUDA only".format(package), needs="gpu")
    try:
        module = __import__(package)
        func = getattr(module, "rmsnorm", None)
        if func is None:
            norm = __import__(package + ".norm", fromlist=["rmsnorm"])
            func = norm.rmsnorm
        gen = torch.Generator().manual_seed(1)
        x = torch.randn(16, 256, generator=gen, dtype=torch.float64)
        w = torch.rand(256, generator=gen, dtype=torch.float64) + 0.5
        eps = 1e-6
        ref = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w
        out = func(x.to("cuda", torch.bfloat16), w.to("cuda", torch.bfloat16), eps)
        torch.cuda.synchronize()
        err = float(torch.linalg.norm(out.double().cpu() - ref) / torch.linalg.norm(ref))
    except BaseException as exc:  # noqa: BLE001 - the failure is the finding
        return _sub(name, "fail", "{}: {}".format(type(exc).__name__, str(exc)[:500]))
    version = getattr(module, "__version__", "?")
    if err > 2e-2:
        return _sub(name, "fail", "{} {}: relative error {:.2e} above the bound 2e-02".format(package, version, err))
    return _sub(name, "pass", "{} {}: 16x256 bfloat16, relative error {:.1e} <= 2e-02".format(package, version, err))


def _numpy_bridge(torch):
    """A round trip through torch's NumPy C-API bridge (``torch.from_numpy``, ``Tensor.numpy``):
    a torch built against NumPy 1.x under NumPy 2 fails here ("Numpy is not available") even
    where ``import torch`` only warned."""
    name = "numpy bridge"
    if importlib.util.find_spec("numpy") is None:
        return _sub(name, "skip", "numpy is not installed")
    import warnings
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import numpy
            array = numpy.arange(6, dtype=numpy.float32).reshape(2, 3)
            back = (torch.from_numpy(array) * 2).numpy()
    except BaseException as exc:  # noqa: BLE001 - the failure is the finding
        return _sub(name, "fail", "numpy {}: {}: {}".format(getattr(sys.modules.get("numpy"), "__version__", "?"),
                                                           type(exc).__name__, str(exc)[:500]))
    if back.tolist() != [[0.0, 2.0, 4.0], [6.0, 8.0, 10.0]] or str(back.dtype) != "float32":
        return _sub(name, "fail", "numpy {}: torch.from_numpy(x) * 2 came back as {!r}".format(numpy.__version__, back))
    noted = [str(w.message) for w in caught if "numpy" in str(w.message).lower()]
    if noted:
        return _sub(name, "fail", "numpy {}: the round trip warned: {}".format(numpy.__version__, noted[0][:300]))
    return _sub(name, "pass", "numpy {}: torch.from_numpy and Tensor.numpy round trip, exact".format(numpy.__version__))


if __name__ == "__main__":
    import faulthandler
    import os

    # a fatal signal (SIGILL from code for CPU features this CPU lacks, SIGSEGV) is said on stderr,
    # which the controller reads when no report comes: over SSH the exit status names no signal
    faulthandler.enable(all_threads=False)
    _code = main(sys.argv[1:])
    # once the report is written the process ends at once, as the import workers do: the teardown of a
    # CUDA stack's thousands of modules and its packages' exit handlers (about 2 s of wall time for
    # the real stack's imports process) change nothing the controller reads
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(_code)
