"""Stand-ins for what this machine cannot have, placed on a system lab host where the real
thing lives: an NVIDIA driver (``/usr/bin/nvidia-smi``, ``libcuda.so.1`` in the multiarch
library folder and the loader cache, ``/proc/driver/nvidia/version``) with its GPUs, a
forward-compatibility ``libcuda`` where the cuda-compat package puts it (``/usr/local/cuda-X.Y/compat``
and an ld.so.conf.d entry), and a CPU of another x86-64 level (``/proc/cpuinfo``).

Each stand-in answers as the real one does for what transplant asks of it, and nothing more:
``nvidia-smi`` prints its header (driver and CUDA version) and the CSV of ``--query-gpu`` for
the fields :data:`FIELDS` knows, and the real failure texts when the driver is not loaded or
does not match; ``libcuda.so.1`` is a shared object compiled here that answers ``cuInit``,
``cuDriverGetVersion`` and the device queries with the configured values (source of the
signatures, codes and attribute numbers: the CUDA Driver API reference, ``cuda.h``). No
product code knows of them: the probe runs the ``nvidia-smi`` it finds on ``PATH`` and reads
the loader cache, as on a real host.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from transplant.core.data import x86_levels
from transplant.lab.systems import SystemHost

__all__ = ["Gpu", "Driver", "install_driver", "remove_driver", "install_compat", "remove_compat", "COMPAT_CONF",
           "set_cpu_level", "remove_cpu", "FIELDS", "LIBCUDA", "NVIDIA_SMI", "Toolkit", "TOOLKITS", "compiler_script",
           "install_toolkit", "remove_toolkit"]

NVIDIA_SMI = "/usr/bin/nvidia-smi"
LIBCUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
#: The ``--query-gpu`` fields the stand-in answers (nvidia-smi --help-query-gpu names them).
FIELDS = ("name", "compute_cap", "memory.total", "driver_version", "count", "index")
#: The real failure texts (nvidia-smi on a host whose kernel module is not loaded, and on one
#: whose user-space library does not match it) and exit codes.
FAILURES = {
    "no-driver": (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
                     "Make sure that the latest NVIDIA driver is installed and running.\n"),
    "mismatch": (18, "Failed to initialize NVML: Driver/library version mismatch\n"),
}
_TEXT = re.compile(r"^[A-Za-z0-9 ._()-]{1,96}$")


@dataclass(frozen=True)
class Gpu:
    """One GPU as the driver reports it.

    :ivar name: the product name (``NVIDIA H100 80GB HBM3``).
    :ivar compute_capability: ``major.minor`` (``9.0``).
    :ivar memory_mib: total memory in MiB.
    """

    name: str
    compute_capability: str
    memory_mib: int


@dataclass(frozen=True)
class Driver:
    """A driver as a host has it.

    :ivar version: the driver version (``580.95.05``).
    :ivar cuda: the newest CUDA version it supports (``13.0``), as ``nvidia-smi`` prints it.
    :ivar gpus: the GPUs it drives.
    :ivar state: ``ok``, or a key of :data:`FAILURES` (the module is not loaded, or another
        version than the library).
    :ivar unversioned_link: whether ``libcuda.so`` (the link that ``-lcuda`` needs) is there too.
    """

    version: str
    cuda: str
    gpus: tuple[Gpu, ...]
    state: str = "ok"
    unversioned_link: bool = True

    def __post_init__(self) -> None:
        if not re.fullmatch(r"\d+\.\d+(\.\d+)?", self.version) or not re.fullmatch(r"\d+\.\d", self.cuda):
            raise ValueError(f"driver version {self.version!r} / CUDA {self.cuda!r} are not versions")
        if self.state != "ok" and self.state not in FAILURES:
            raise ValueError(f"driver state {self.state!r} is not ok or one of {sorted(FAILURES)}")
        for gpu in self.gpus:
            if not _TEXT.match(gpu.name) or not re.fullmatch(r"\d+\.\d", gpu.compute_capability):
                raise ValueError(f"GPU {gpu!r}: a plain name and a major.minor compute capability")


def _nvidia_smi(driver: Driver) -> str:
    """The stand-in ``nvidia-smi``: a Python script for the host's own ``python3``."""
    rows = [{"name": g.name, "compute_cap": g.compute_capability, "memory.total": str(g.memory_mib),
             "driver_version": driver.version, "count": str(len(driver.gpus)), "index": str(i)}
            for i, g in enumerate(driver.gpus)]
    failure = FAILURES.get(driver.state)
    return f'''#!/usr/bin/python3
# Stand-in for nvidia-smi on a transplant lab host (transplant.lab.standins): driver {driver.version}.
import sys
FAILURE = {failure!r}
ROWS = {rows!r}
if FAILURE:
    sys.stdout.write(FAILURE[1])
    sys.exit(FAILURE[0])
args = sys.argv[1:]
query = [a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")]
if query:
    fields = query[0].split(",")
    unknown = [f for f in fields if f not in ROWS[0]] if ROWS else []
    if unknown:
        sys.stdout.write('Field "%s" is not a valid field to query.\\n\\n' % unknown[0])
        sys.exit(2)
    form = [a.split("=", 1)[1] for a in args if a.startswith("--format=")]
    options = form[0].split(",") if form else []
    units = {{"memory.total": " MiB"}}
    if "noheader" not in options:
        print(", ".join(f + (" [MiB]" if f in units and "nounits" not in options else "") for f in fields))
    for row in ROWS:
        print(", ".join(row[f] + ("" if "nounits" in options else units.get(f, "")) for f in fields))
    sys.exit(0)
if not ROWS:
    print("No devices were found")
    sys.exit(6)
print("+-----------------------------------------------------------------------------------------+")
print("| NVIDIA-SMI {driver.version:<22} Driver Version: {driver.version:<14} CUDA Version: {driver.cuda:<9}|")
print("|-----------------------------------------+------------------------+----------------------+")
for row in ROWS:
    print("| %3s  %-36s |" % (row["index"], row["name"]))
'''


def _libcuda_source(driver: Driver, init_error: int = 0) -> str:
    major, minor = driver.cuda.split(".")
    names = ", ".join(f'"{g.name}"' for g in driver.gpus) or '""'
    caps = ", ".join(g.compute_capability.replace(".", ", ") for g in driver.gpus) or "0, 0"
    memory = ", ".join(f"{g.memory_mib}ULL" for g in driver.gpus) or "0ULL"
    return f"""/* Stand-in for the NVIDIA driver's libcuda.so.1 (transplant.lab.standins), driver {driver.version}. */
#include <stddef.h>
#include <string.h>
typedef int CUresult;
typedef int CUdevice;
enum {{ CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_NOT_INITIALIZED = 3, CUDA_ERROR_NO_DEVICE = 100,
       CUDA_ERROR_INVALID_DEVICE = 101 }};
enum {{ ATTR_CC_MAJOR = 75, ATTR_CC_MINOR = 76 }};
static const int count = {len(driver.gpus)};
static const char *names[] = {{ {names} }};
static const int caps[] = {{ {caps} }};
static const unsigned long long mib[] = {{ {memory} }};
static int started;
CUresult cuInit(unsigned int flags) {{ if ({init_error}) return {init_error}; if (flags) return CUDA_ERROR_INVALID_VALUE; if (!count) return CUDA_ERROR_NO_DEVICE; started = 1; return CUDA_SUCCESS; }}
CUresult cuDriverGetVersion(int *version) {{ if (!version) return CUDA_ERROR_INVALID_VALUE; *version = {int(major) * 1000 + int(minor) * 10}; return CUDA_SUCCESS; }}
CUresult cuDeviceGetCount(int *n) {{ if (!started) return CUDA_ERROR_NOT_INITIALIZED; *n = count; return CUDA_SUCCESS; }}
CUresult cuDeviceGet(CUdevice *device, int ordinal) {{
  if (!started) return CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal < 0 || ordinal >= count) return CUDA_ERROR_INVALID_DEVICE;
  *device = ordinal; return CUDA_SUCCESS; }}
CUresult cuDeviceGetName(char *name, int len, CUdevice device) {{
  if (!started) return CUDA_ERROR_NOT_INITIALIZED;
  if (device < 0 || device >= count) return CUDA_ERROR_INVALID_DEVICE;
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  strncpy(name, names[device], (size_t)len - 1); name[len - 1] = 0; return CUDA_SUCCESS; }}
CUresult cuDeviceComputeCapability(int *major, int *minor, CUdevice device) {{
  if (!started) return CUDA_ERROR_NOT_INITIALIZED;
  if (device < 0 || device >= count) return CUDA_ERROR_INVALID_DEVICE;
  *major = caps[2 * device]; *minor = caps[2 * device + 1]; return CUDA_SUCCESS; }}
CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device) {{
  if (!started) return CUDA_ERROR_NOT_INITIALIZED;
  if (device < 0 || device >= count) return CUDA_ERROR_INVALID_DEVICE;
  if (attribute == ATTR_CC_MAJOR) {{ *value = caps[2 * device]; return CUDA_SUCCESS; }}
  if (attribute == ATTR_CC_MINOR) {{ *value = caps[2 * device + 1]; return CUDA_SUCCESS; }}
  return CUDA_ERROR_INVALID_VALUE; }}
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {{
  if (!started) return CUDA_ERROR_NOT_INITIALIZED;
  if (device < 0 || device >= count) return CUDA_ERROR_INVALID_DEVICE;
  *bytes = (size_t)(mib[device] << 20); return CUDA_SUCCESS; }}
"""


def build_libcuda(driver: Driver, init_error: int = 0) -> bytes:
    """The stand-in ``libcuda.so.1`` for ``driver``, compiled here with ``cc`` (DT_SONAME
    ``libcuda.so.1``; it needs only the C library, so it loads on every lab release). A non-zero
    ``init_error`` is what its ``cuInit`` returns (804, CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE,
    for a forward-compatibility library on a GPU it does not support).

    :raises subprocess.CalledProcessError: the compiler failed.
    :raises FileNotFoundError: no ``cc`` here (``apt-get install gcc libc6-dev``).
    """
    with tempfile.TemporaryDirectory(prefix="transplant-libcuda-") as folder:
        source, out = Path(folder) / "libcuda.c", Path(folder) / "libcuda.so.1"
        source.write_text(_libcuda_source(driver, init_error))
        subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-Wl,-soname,libcuda.so.1", "-o", str(out), str(source)],
                       check=True, capture_output=True)
        return out.read_bytes()


def install_driver(host: SystemHost, driver: Driver) -> None:
    """Give ``host`` the driver: ``nvidia-smi``, ``libcuda.so.1`` (and ``libcuda.so`` when
    :attr:`Driver.unversioned_link`) in the loader cache, and ``/proc/driver/nvidia/version``
    (bound at the host's start: a running host is restarted on the same address and port)."""
    host.install(NVIDIA_SMI, _nvidia_smi(driver).encode(), 0o755)
    host.install(LIBCUDA, build_libcuda(driver), 0o755)
    link = LIBCUDA[: -len(".1")]
    host.run(["rm", "-f", link])
    if driver.unversioned_link:
        host.run(["ln", "-s", "libcuda.so.1", link])
    host.run(["/sbin/ldconfig"])
    version = host.folder / "proc-driver" / "nvidia" / "version"
    version.parent.mkdir(parents=True, exist_ok=True)
    version.write_text(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {driver.version}  (transplant lab stand-in)\n"
                       "GCC version:  (stand-in)\n")
    _restart(host)


def remove_driver(host: SystemHost) -> None:
    """Take the driver stand-ins off ``host`` again (a host without a driver, as it started)."""
    host.run(["rm", "-f", NVIDIA_SMI, LIBCUDA, LIBCUDA[: -len(".1")]])
    host.run(["/sbin/ldconfig"])
    version = host.folder / "proc-driver" / "nvidia" / "version"
    version.unlink(missing_ok=True)
    if version.parent.is_dir():
        version.parent.rmdir()
    _restart(host)


#: The ld.so.conf.d entry naming the compat folder: read before the multiarch folders' entries
#: (``/etc/ld.so.conf`` includes ``/etc/ld.so.conf.d/*.conf`` in name order), so the loader cache
#: gives the compat library first, as on a host set up by NVIDIA's guide.
COMPAT_CONF = "/etc/ld.so.conf.d/cuda-compat.conf"
#: What a forward-compatibility libcuda's cuInit returns on a GPU it does not support
#: (CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, cuda.h).
COMPAT_NOT_SUPPORTED = 804


def install_compat(host: SystemHost, compat: Driver, *, supported: bool = True) -> str:
    """Give ``host`` a forward-compatibility ``libcuda`` where the cuda-compat package puts it:
    ``/usr/local/cuda-<compat.cuda>/compat/libcuda.so.<compat.version>`` with the ``libcuda.so.1``
    and ``libcuda.so`` links, and :data:`COMPAT_CONF` naming that folder, then the loader cache.
    ``compat`` is the driver release the package was made from; its ``cuInit`` returns
    :data:`COMPAT_NOT_SUPPORTED` unless ``supported``. Returns the folder."""
    folder = f"/usr/local/cuda-{compat.cuda}/compat"
    host.install(f"{folder}/libcuda.so.{compat.version}",
                 build_libcuda(compat, 0 if supported else COMPAT_NOT_SUPPORTED), 0o755)
    host.run(["ln", "-sfn", f"libcuda.so.{compat.version}", f"{folder}/libcuda.so.1"])
    host.run(["ln", "-sfn", "libcuda.so.1", f"{folder}/libcuda.so"])
    host.install(COMPAT_CONF, f"{folder}\n".encode(), 0o644)
    host.run(["/sbin/ldconfig"])
    return folder


def remove_compat(host: SystemHost, cuda: str) -> None:
    """Take the compat library of CUDA ``cuda`` (``12.8``) and :data:`COMPAT_CONF` off ``host``."""
    if not re.fullmatch(r"\d+\.\d", cuda):
        raise ValueError(f"CUDA {cuda!r} is not a version")
    host.run(["rm", "-rf", "--", f"/usr/local/cuda-{cuda}/compat", COMPAT_CONF])
    host.run(["/sbin/ldconfig"])


def _restart(host: SystemHost) -> None:
    if host.pid is not None:
        host.stop_sshd()
        host.start_sshd()


def set_cpu_level(host: SystemHost, level: str) -> None:
    """Give ``host`` a ``/proc/cpuinfo`` whose CPU has exactly the flags of x86-64 ``level`` and
    the levels below it (``data/x86_levels.json``), bound at the host's start (a running host is
    restarted). The kernel still runs this machine's CPU: only what the host reads changes.

    :raises ValueError: ``level`` is not in the table.
    """
    levels = x86_levels()["levels"]
    if level not in levels:
        raise ValueError(f"x86-64 level {level!r} is not one of {', '.join(levels)}")
    names = list(levels)
    flags = [f for name in names[: names.index(level) + 1] for f in levels[name]]
    (host.folder / "cpuinfo").write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\n"
        f"model name\t: transplant lab stand-in ({level})\nflags\t\t: {' '.join(flags)}\n\n")
    _restart(host)


def remove_cpu(host: SystemHost) -> None:
    """Take the CPU stand-in off ``host`` (it reads this machine's ``/proc/cpuinfo`` again)."""
    (host.folder / "cpuinfo").unlink(missing_ok=True)
    _restart(host)


@dataclass(frozen=True)
class Toolkit:
    """A CUDA toolkit release as its compilers print it.

    :ivar release: ``12.8``. :ivar build: the full version (``12.8.93``).
    :ivar built: nvcc's "Built on" line. :ivar tag: its "Build" line.
    """

    release: str
    build: str
    built: str
    tag: str


#: Releases whose ``nvcc --version`` text is known (the real output of CUDA 12.8 Update 1's nvcc,
#: as printed on hosts that have it).
TOOLKITS = {
    "12.8": Toolkit("12.8", "12.8.93", "Fri_Feb_21_20:23:50_PST_2025", "cuda_12.8.r12.8/compiler.35583870_0"),
}
_HEADS = {"nvcc": "nvcc: NVIDIA (R) Cuda compiler driver", "ptxas": "ptxas: NVIDIA (R) Ptx optimizing assembler"}


def compiler_script(kit: Toolkit, tool: str) -> str:
    """A stand-in ``nvcc`` or ``ptxas`` (``tool``) for ``/bin/sh`` that prints ``kit``'s
    ``--version`` text and fails on anything else (it compiles nothing)."""
    year = kit.built.rsplit("_", 1)[-1]
    lines = [_HEADS[tool], f"Copyright (c) 2005-{year} NVIDIA Corporation", f"Built on {kit.built}",
             f"Cuda compilation tools, release {kit.release}, V{kit.build}", f"Build {kit.tag}"]
    quoted = " ".join("'" + line + "'" for line in lines)
    return (f"#!/bin/sh\n# Stand-in for {tool} of CUDA {kit.build} (transplant.lab.standins): it prints its version only.\n"
            f"case \"$1\" in --version|-V) printf '%s\\n' {quoted}; exit 0;; esac\n"
            f"echo \"{tool} fatal   : this stand-in compiles nothing\" >&2\nexit 1\n")


def install_toolkit(host: SystemHost, kit: Toolkit) -> None:
    """Give ``host`` CUDA ``kit`` where NVIDIA's packages put it: ``/usr/local/cuda-X.Y/bin/nvcc``
    and ``ptxas``, and the ``/usr/local/cuda`` link to it (what a JIT user falls back on when
    neither ``CUDA_HOME`` nor ``PATH`` names one)."""
    home = f"/usr/local/cuda-{kit.release}"
    for tool in ("nvcc", "ptxas"):
        host.install(f"{home}/bin/{tool}", compiler_script(kit, tool).encode(), 0o755)
    host.run(["rm", "-f", "/usr/local/cuda"])
    host.run(["ln", "-s", f"cuda-{kit.release}", "/usr/local/cuda"])


def remove_toolkit(host: SystemHost, kit: Toolkit) -> None:
    """Take ``kit`` and the ``/usr/local/cuda`` link off ``host``."""
    host.run(["rm", "-rf", f"/usr/local/cuda-{kit.release}", "/usr/local/cuda"])
