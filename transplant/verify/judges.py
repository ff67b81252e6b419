"""Verify stage results and how each stage's report is judged, every ``judge_*`` of the ladder (pure core).

A stage is ``pass``, ``fail`` or ``skip``, always with a reason and seconds; a skip is
never counted as a pass (:func:`overall_ok` is False only for failures, and reports
show skips as skips).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from transplant.core.units import clip, count
from transplant.core.plan import Finding
from transplant.core.data import x86_levels
from transplant.core.rules.cpu import missing_flags
from transplant.remote._common import ILLEGAL_INSTRUCTION
from transplant.verify.ladder import (DRIVER_SONAMES, GPU_WORDS, MISSING_LIBRARY, SHARED_OBJECT, inside_roots,
                                      library_key, load_error, missing_driver_library, pip_shipped_library,
                                      provenance_conflicts)

__all__ = [
    "VERIFY_SCHEMA",
    "StageResult",
    "judge_imports",
    "judge_server_args",
    "judge_smoke",
    "judge_requirements",
    "expect_matches",
    "overall_ok",
    "judge_interpreter",
    "judge_native",
    "native_kinds",
    "native_verdict",
    "native_unchecked",
    "imports_unchecked",
    "CAUSES",
    "judge_provenance",
    "judge_resolve",
    "judge_serve",
    "answer_at",
    "judge_jit_caches",
    "stale_versions",
    "name_cpu_gap",
    "cpu_level",
]

VERIFY_SCHEMA = "transplant.verify/3"  # 2: the ladder's stages, "counts"; 3: "cause", "unchecked", "causes"
STATUSES = ("pass", "fail", "skip")

#: Why a stage or an item was not checked: cause -> how the verdict names it (the causes are
#: explained in :mod:`transplant.verify.verdict` and REFERENCE.md).
CAUSES: Mapping[str, str] = {
    "not-requested": "not requested",
    "nothing-to-check": "nothing to check",
    "not-run": "not run",
    "no-driver": "no NVIDIA driver",
    "no-torch": "no torch",
    "no-device": "no GPU visible",
    "no-model": "the model is not on this host",
    "donor-identical": "fails identically in the donor",
}


@dataclass(frozen=True, kw_only=True)
class StageResult:
    """One verify stage: ``status`` in pass/fail/skip, a one-line ``reason``, wall ``seconds``,
    and ``details`` (stage-specific JSON: imports with versions and files, parsed values...).

    :ivar cause: for a skip, why it did not run (a key of :data:`CAUSES`); None for a pass or a
        fail, and for a skip that predates causes (read as ``not-run``).
    :ivar unchecked: the items a passing stage could not check here, each ``{"item", "cause",
        "evidence"}`` (the import, or the venv-relative shared object; a cause of :data:`CAUSES`;
        the error that shows it).
    """

    name: str
    status: str
    reason: str
    seconds: float
    details: Mapping[str, Any] = field(default_factory=dict)
    cause: str | None = None
    unchecked: tuple[Mapping[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")
        for cause in [self.cause, *(u.get("cause") for u in self.unchecked)]:
            if cause is not None and cause not in CAUSES:
                raise ValueError(f"cause {cause!r} is not one of {tuple(CAUSES)}")

    def to_dict(self) -> dict[str, Any]:
        """``{"name", "status", "reason", "seconds", "cause", "unchecked", "details"}``."""
        return {"name": self.name, "status": self.status, "reason": self.reason, "cause": self.cause,
                "unchecked": [dict(u) for u in self.unchecked], "seconds": round(self.seconds, 3),
                "details": dict(self.details)}


def judge_imports(report: Mapping[str, Any], *, driver: bool = True, donor_shared: Collection[str] = (),
                  needs_gpu: Collection[str] = ()) -> tuple[str, str]:
    """(status, reason) for the imports script's report
    (``{"imports": [{"name", "ok", "version", "error"}]}``): fail if any import failed.

    An import whose error is that a driver library (:data:`transplant.verify.ladder.DRIVER_SONAMES`,
    e.g. ``libcuda.so.1``) cannot be opened is, on a host without a driver (``driver`` False),
    not checkable here: neither a pass nor a fail; the reason names it. The same rule as
    native-load's (:func:`judge_native`): the driver is installed with the
    GPU, never by a wheel, so its absence says nothing about the venv. With ``driver`` True
    (the default, also when the host's driver facts are unknown) it is a failure.
    An import of ``needs_gpu`` (the manifest's ``needs: [gpu]``) that fails where ``driver`` is
    False is not checkable here either, whatever its error.
    An import in ``donor_shared`` fails the same way on the donor (same exception class:
    :func:`transplant.verify.ladder.donor_shared_imports`): what the donor runs, a warning in a
    passing stage, not a fault of the transplant.
    Status: fail on any failure; skip when nothing was checkable (or nothing to check);
    else pass.
    """
    items = report.get("imports", [])
    if not items:
        return "skip", "no import names to check (set verify.imports)"
    uncheckable, donor_too = _imports_excused(items, driver, donor_shared, needs_gpu)
    skipped = {id(i) for i, _ in uncheckable} | {id(i) for i in donor_too}
    failed = [i for i in items if not i.get("ok") and id(i) not in skipped]
    note = ""
    if uncheckable:
        named = ", ".join(f"{i['name']} (needs {lib})" for i, lib in uncheckable if lib != "needs: [gpu]")
        marked = ", ".join(i["name"] for i, lib in uncheckable if lib == "needs: [gpu]")
        note = f"; not checkable here: {named}, the NVIDIA driver's library, absent on this host" if named else ""
        if marked:
            note += f"; not checkable here: {marked} (verify.imports: needs: [gpu]), and this host has no NVIDIA driver"
    if donor_too:
        note += _donor_note([f"{i['name']} ({clip(str(i.get('error')), 160)})" for i in donor_too])
    if failed:
        first = failed[0]
        return "fail", f"{len(failed)} of {count(len(items), 'import')} failed; {first['name']}: {first.get('error')}{note}"
    passed = [i for i in items if i.get("ok")]
    if not passed:
        return "skip", f"no import could be checked{note}"
    parts = ", ".join(f"{i['name']} {i.get('version') or '?'}"
                      + (f" (from {i['outside']}, outside the venv)" if i.get("outside") else "") for i in passed)
    head = count(len(items), "import") if len(passed) == len(items) else f"{len(passed)} of {count(len(items), 'import')}"
    return "pass", f"{head}: {parts}{note}"


def _imports_excused(items: Sequence[Mapping[str, Any]], driver: bool, donor_shared: Collection[str],
                     needs_gpu: Collection[str] = ()) -> tuple[list[tuple[Mapping[str, Any], str]], list[Mapping[str, Any]]]:
    """The failed imports not checkable here: (those needing an absent driver, with what shows
    it: its library's soname, or the manifest's ``needs: [gpu]``; those failing the same way
    on the donor)."""
    uncheckable = [(i, missing_driver_library(i.get("error")) or ("needs: [gpu]" if i["name"] in needs_gpu else None))
                   for i in items if not i.get("ok") and not driver]
    needing = [(i, lib) for i, lib in uncheckable if lib]
    taken = {id(i) for i, _ in needing}
    shared = set(donor_shared)
    return needing, [i for i in items if not i.get("ok") and id(i) not in taken and i["name"] in shared]


def imports_unchecked(report: Mapping[str, Any], *, driver: bool = True, donor_shared: Collection[str] = (),
                      needs_gpu: Collection[str] = ()) -> tuple[dict[str, str], ...]:
    """The imports :func:`judge_imports` excuses, as :attr:`StageResult.unchecked` items:
    ``no-driver`` (needs the absent driver's library, or the manifest says it needs a GPU),
    ``donor-identical`` (fails the same way on the donor)."""
    needing, donor_too = _imports_excused(report.get("imports", []), driver, donor_shared, needs_gpu)
    return (tuple({"item": str(i["name"]), "cause": "no-driver",
                   "evidence": f"{lib}: {clip(str(i.get('error')), 200)}" if lib == "needs: [gpu]" else f"needs {lib}"}
                  for i, lib in needing)
            + tuple({"item": str(i["name"]), "cause": "donor-identical", "evidence": clip(str(i.get("error")), 300)}
                    for i in donor_too))


def _donor_note(named: Sequence[str]) -> str:
    """A passing stage's note on the items that fail identically in the donor (the first three named)."""
    more = f"; and {len(named) - 3} more" if len(named) > 3 else ""
    them = "fails identically in the donor, which runs with it" if len(named) == 1 else \
        "fail identically in the donor, which runs with them"
    return f"; not checkable here: {len(named)} {them} (not a fault of the transplant): {'; '.join(named[:3])}{more}"


def expect_matches(want: Any, got: Mapping[str, Any] | None) -> bool:
    """Whether a parsed attribute (as the server-args script describes it) matches ``want``.

    An enum matches by its name or value (``DFLASH`` matches ``SpeculativeAlgorithm.DFLASH``);
    numbers compare by value, so ``16`` matches ``16`` and ``16.0``; strings compare exactly.
    """
    if got is None:
        return False
    candidates = [got.get("value"), got.get("name")]
    for have in candidates:
        if have is None and want is not None:
            continue
        if isinstance(want, bool) or isinstance(have, bool):
            if want is have:
                return True
            continue
        if isinstance(want, (int, float)) and isinstance(have, (int, float)):
            if float(want) == float(have):
                return True
            continue
        if have == want or (isinstance(have, str) and have == str(want)):
            return True
    return False


def judge_server_args(expect: Mapping[str, Any], report: Mapping[str, Any]) -> tuple[str, str]:
    """(status, reason) for the server-args script's report against the manifest's ``expect``."""
    if not report.get("ok"):
        return "fail", f"the parser rejected the arguments: {report.get('error')}"
    values = report.get("values", {})
    wrong = []
    for key, want in expect.items():
        got = values.get(key)
        if not expect_matches(want, got):
            shown = "missing" if got is None else (got.get("name") or got.get("value") or got.get("repr"))
            wrong.append(f"{key}={shown!s} (expected {want!s})")
    if wrong:
        return "fail", "parsed, but " + "; ".join(wrong)
    shown = " ".join(str(values[k].get("name") or values[k].get("value")) for k in expect)
    return "pass", f"parsed; {shown} ({', '.join(expect)})" if expect else "parsed (no expect map to compare)"


def judge_smoke(report: Mapping[str, Any]) -> tuple[str, str]:
    """(status, reason) for the smoke script's report (it already applied the manifest's device choice).

    Its sub-checks (triton, sgl_kernel, flashinfer) fail the stage when one fails; a skipped
    one is named as skipped, with its reason, in the reason of a passing stage. A venv without
    torch at all is a skip (nothing to smoke-test there), never a pass.
    """
    checks = report.get("checks", [])
    subs = report.get("subchecks", [])
    if report.get("skipped") is True and not checks:
        return "skip", str(report.get("reason"))
    if not report.get("ok"):
        bad = [c for c in checks if not c.get("ok")]
        if bad:
            c = bad[0]
            return "fail", (f"{c['name']} {c['dtype']} on {report.get('device')}: relative error "
                            f"{c['rel_error']:.2e} above the bound {c['bound']:.0e}")
    failed = [c for c in subs if c.get("status") == "fail"]
    if failed:
        return "fail", "; ".join(f"{c['name']}: {c['reason']}" for c in failed)
    if not report.get("ok"):
        return "fail", str(report.get("reason"))
    if not checks:
        return "fail", "the smoke script ran no check"
    worst = ", ".join(f"{c['name']} {c['dtype']} {c['rel_error']:.1e} <= {c['bound']:.0e}" for c in checks)
    tail = "".join(f"; {c['name']}: {c['status']} ({c['reason']})" for c in subs)
    return "pass", f"{report.get('reason')}; torch {report.get('torch')}; {worst}{tail}"


def judge_requirements(findings: Sequence[Finding], *, donor: bool = True) -> tuple[str, str]:
    """(status, reason) from requirement findings: fail on any error, else pass (warnings counted).

    :param donor: whether the findings were judged against a donor's environment (an unmet
        requirement is an error only when the donor satisfies it); False (a venv verified alone,
        or a donor that could not be read): every unmet requirement is an error, and the reason
        names no donor. Each message shown is cut at a word boundary (:func:`clip`).
    """
    errors = [f for f in findings if f.severity == "error"]
    warnings = [f for f in findings if f.severity != "error"]
    if errors:
        shown = "; ".join(clip(f.message, 160) for f in errors[:3])
        more = f"; and {len(errors) - 3} more" if len(errors) > 3 else ""
        which = " the donor satisfies" if donor else ""
        return "fail", f"{count(len(errors), 'distribution')} with unmet requirements{which}: {shown}{more}"
    tail = "".join(f"; warning: {clip(w.message, 120)}" for w in warnings)
    if not donor:
        return "pass", "every requirement of the venv's distributions is satisfied" + tail
    return "pass", "every requirement the donor satisfies is satisfied" + tail


def overall_ok(results: Sequence[StageResult]) -> bool:
    """True when no stage failed (skips do not fail the run, and are never shown as passes)."""
    return not any(r.status == "fail" for r in results)


def judge_interpreter(target: Mapping[str, Any], expected: Mapping[str, Any] | None, *,
                      python: str | None = None, foreign: Sequence[str] | None = None) -> tuple[str, str]:
    """(status, reason) for the target's interpreter.

    :param target: ``{"version": "3.11.2", "implementation": "cpython", "home": str | None,
        "home_exists": bool | None, "executable": str}`` from the target's probe.
    :param expected: the same keys for the donor's interpreter, or None when there is no donor
        to compare with (then only ``home`` and ``python`` are checked, and the reason says so).
    :param python: the manifest's ``verify.python`` (``3.11`` or ``3.11.9``): the target's version
        must start with it; None: not checked.
    :param foreign: venv-relative extension modules of the target venv whose ABI suffix
        (``.cpython-313-x86_64-linux-gnu.so``, PEP 3149) is not the target interpreter's. With
        another CPython minor than the donor's, an empty list passes (pure-Python distributions
        moved between minors: nothing in the venv needs the donor's ABI) and a non-empty one
        fails naming them; None (not read) fails on the minor alone.
    """
    home, version = target.get("home"), str(target.get("version"))
    if target.get("home_exists") is False:
        return "fail", f"pyvenv.cfg home {home} does not exist: the venv's python points to nothing"
    minor = ".".join(version.split(".")[:2])
    impl = target.get("implementation")
    where = f"{impl} {version} ({target.get('executable')}, home {home})"
    if python is not None and version.split(".")[:len(python.split("."))] != python.split("."):
        return "fail", f"{where}, but the manifest expects Python {python} (verify.python)"
    if python is not None:
        where += f"; Python {python} as the manifest expects"
    if expected is None:
        return "pass", f"{where}; no donor interpreter to compare with"
    want_minor = ".".join(str(expected.get("version")).split(".")[:2])
    if (impl, minor) != (expected.get("implementation"), want_minor):
        same_impl = impl == expected.get("implementation") == "cpython"
        if same_impl and foreign is not None and not foreign:
            return "pass", (f"{where}; the donor runs {expected.get('version')}, another minor, and no extension "
                            f"module in this venv is built for another Python than {minor} (pure-Python "
                            f"distributions moved between minors)")
        named = f" ({count(len(foreign), 'extension module')}: {', '.join(foreign[:3])}" \
                f"{' ...' if len(foreign) > 3 else ''})" if same_impl and foreign else ""
        return "fail", (f"{where}, but the donor runs {expected.get('implementation')} {expected.get('version')}: "
                        f"extension modules built for {want_minor} do not load in {minor}{named}")
    return "pass", f"{where}; matches the donor's {expected.get('version')}"


def judge_native(report: Mapping[str, Any], *, driver: bool, venv: str = "",
                 shipped: Iterable[str] | None = None, donor_shared: Iterable[str] = (),
                 donor_system: Collection[str] | None = None) -> tuple[str, str]:
    """(status, reason) for the native-load script's report
    (``{"preload": [...], "libraries": [{"path", "ok", "error", "skipped"?, "missing"?}]}``).

    Each library that did not load is, by kind:

    - ``skipped`` by the script (its ELF header names another machine or class than the
      interpreter's, like the ``stubs/aarch64-*`` objects of the x86_64 nvidia-cutlass-dsl
      wheels): not loadable here by construction; counted as skipped, by machine.
    - an undefined symbol, or any error other than a missing soname: a failure.
    - missing sonames (``missing``, the loader's full list, with the one dlopen named): a
      failure if any is a library a pip distribution ships (:func:`pip_shipped_library`
      against ``shipped``: the venv ships it, or it is of the CUDA/torch families). Else, one
      missing a driver library (:data:`DRIVER_SONAMES`) fails where the host has a driver
      (``driver`` True) and is not checkable otherwise. Else every missing soname is a host
      library no distribution of the venv ships: an optional plugin's dependency (cufile's
      RDMA transport needs ``libmlx5.so.1``, nvshmem's bootstraps and transports ``libmpi``,
      ``libpmix``, ``libfabric``, UCX; numba's TBB pool ``libtbb.so.12``), which loads where
      the host installs that library; a warning in a passing stage, naming each library and
      how many objects need it. Without ``shipped`` (None) the venv's libraries are unknown
      and every missing soname other than a driver's is a failure.
    - missing only libraries the venv ships whose own copies in the report are not loadable here
      for one of the two host reasons above (torchcodec's ``libtorchcodec_custom_ops4.so``
      needs ``libtorchcodec_core4.so``, which needs FFmpeg 4's ``libavutil.so.56``): that reason,
      passed on. The script has already loaded such files again after all the others, so a
      sibling the package loads by path first is found.

    - a failure in ``donor_shared`` (:func:`donor_shared_objects`: the donor's own copy fails
      the same way, as cuda-core's ``_tensor_bridge`` with its undefined
      ``aoti_torch_dtype_float32``, or torch_memory_saver's CUDA 12 variant in a CUDA 13 venv):
      what the donor runs, a warning in a passing stage.

    :param shipped: the venv's library keys (:func:`record_library_keys` over every
        distribution), or None.
    :param donor_shared: absolute paths (in this venv) whose failure the donor shares.
    :param donor_system: the library file names the donor's host provides outside its venv
        (the donor inventory's ``system_sonames``), or None when unknown. A host library that
        no distribution ships, absent here but present on the donor's system, is a failure
        naming that difference (the target's system lacks what the donor's runs with), not
        an optional plugin's.
    :param venv: stripped from the paths shown.
    Status: fail on any failure; skip when there is no library, or none could be checked;
    else pass.
    """
    kinds = native_kinds(report, driver=driver, shipped=shipped, donor_shared=donor_shared, donor_system=donor_system)
    return native_verdict(report, kinds, venv)


def native_kinds(report: Mapping[str, Any], *, driver: bool, shipped: Iterable[str] | None = None,
                 donor_shared: Iterable[str] = (), donor_system: Collection[str] | None = None
                 ) -> dict[str, tuple[str, Any]]:
    """Each shared object of the native-load report that did not load -> ``(kind, what)``:
    ``("fail", text)``, ``("system", names)`` (host libraries the donor's system has and this
    one lacks), ``("driver", names)``, ``("optional", names)``, ``("foreign", why)`` or
    ``("donor", text)``; see :func:`judge_native` for the rules and its parameters."""
    libraries = report.get("libraries", [])
    keys = set(shipped) if shipped is not None else None
    # kind per path: ("fail", what) | ("driver", names) | ("optional", names) | ("foreign", why)
    kinds: dict[str, tuple[str, Any]] = {}
    venv_missing: dict[str, list[str]] = {}
    for lib in libraries:
        if lib.get("ok"):
            continue
        path = str(lib["path"])
        if lib.get("skipped"):
            kinds[path] = ("foreign", lib["skipped"])
            continue
        error = str(lib.get("error"))
        first = MISSING_LIBRARY.search(error)
        if first is None:
            kinds[path] = ("fail", load_error(error))
            continue
        names = sorted(set(lib.get("missing") or ()) | {first.group(1)})
        ours = [n for n in names if n not in DRIVER_SONAMES and (keys is None or pip_shipped_library(n, keys))]
        drivers = [n for n in names if n in DRIVER_SONAMES]
        if ours:
            kinds[path] = ("fail", "missing " + ", ".join(ours))
            venv_missing[path] = ours
        elif drivers and driver:
            kinds[path] = ("fail", "missing " + ", ".join(drivers))
        elif drivers:
            kinds[path] = ("driver", names)
        elif donor_system is not None and set(names) & set(donor_system):
            kinds[path] = ("system", sorted(set(names) & set(donor_system)))
        else:
            kinds[path] = ("optional", names)
    # a library of the venv that is not loadable here only for a host reason (a driver, an
    # optional host library) passes that reason on to the venv's objects that need it
    copies: dict[str, list[str]] = {}
    for lib in libraries:
        copies.setdefault(library_key(str(lib["path"])), []).append(str(lib["path"]))
    changed = True
    while changed:
        changed = False
        for path, ours in venv_missing.items():
            if kinds[path][0] != "fail":
                continue
            inherited: list[tuple[str, Any]] = []
            for name in ours:
                found = [kinds.get(c, ("ok", None)) for c in copies.get(library_key(name), [])]
                host = [k for k in found if k[0] in ("driver", "optional")]
                if not host or len(host) != len(found):
                    break
                inherited.extend(host)
            else:
                names = sorted({n for _, ns in inherited for n in ns})
                kinds[path] = ("driver" if any(k == "driver" for k, _ in inherited) else "optional", names)
                changed = True
    shared_with_donor = set(donor_shared)
    for path, kind in list(kinds.items()):
        if kind[0] == "fail" and path in shared_with_donor:
            kinds[path] = ("donor", kind[1])
    return kinds


def native_unchecked(report: Mapping[str, Any], kinds: Mapping[str, tuple[str, Any]], venv: str
                     ) -> tuple[dict[str, str], ...]:
    """The shared objects :func:`native_kinds` found not checkable here, as
    :attr:`StageResult.unchecked` items (venv-relative paths): ``no-driver`` for those needing
    the driver's libraries, ``donor-identical`` for those failing the same way in the donor."""
    prefix = venv.rstrip("/") + "/" if venv else ""
    out = []
    for lib in report.get("libraries", []):
        path = str(lib.get("path"))
        kind, what = kinds.get(path, ("", None))
        shown = path[len(prefix):] if prefix and path.startswith(prefix) else path
        if kind == "driver":
            out.append({"item": shown, "cause": "no-driver", "evidence": "missing " + ", ".join(what)})
        elif kind == "donor":
            out.append({"item": shown, "cause": "donor-identical", "evidence": str(what)})
    return tuple(out)


def native_verdict(report: Mapping[str, Any], found: Mapping[str, tuple[str, Any]], venv: str) -> tuple[str, str]:
    """:func:`judge_native`'s (status, reason) from the kinds :func:`native_kinds` found (not changed)."""
    libraries = report.get("libraries", [])
    if not libraries:
        return "skip", "the overlaid distributions ship no shared objects"
    kinds = dict(found)
    for path, (kind, names) in found.items():
        if kind == "system":
            kinds[path] = ("fail", "missing " + ", ".join(names) + " (the donor's system has "
                           + ("it" if len(names) == 1 else "them") + "; this host's has not)")
    failed = [(lib, kinds[str(lib["path"])][1]) for lib in libraries if kinds.get(str(lib["path"]), ("",))[0] == "fail"]
    donor_too = [(lib, kinds[str(lib["path"])][1]) for lib in libraries
                 if kinds.get(str(lib["path"]), ("",))[0] == "donor"]
    driverless = [lib for lib in libraries if kinds.get(str(lib["path"]), ("",))[0] == "driver"]
    foreign = [lib for lib in libraries if kinds.get(str(lib["path"]), ("",))[0] == "foreign"]
    optional = [(lib, kinds[str(lib["path"])][1]) for lib in libraries
                if kinds.get(str(lib["path"]), ("",))[0] == "optional"]
    prefix = venv.rstrip("/") + "/" if venv else ""

    def shown(path: str) -> str:
        return path[len(prefix):] if prefix and path.startswith(prefix) else path

    not_loaded = [p for p in report.get("preload", []) if not p.get("ok")]
    note = "".join(f"; note: preloading {p['name']} failed ({p['error']})" for p in not_loaded)
    if foreign:
        machines: dict[str, int] = {}
        for lib in foreign:
            word = str(lib["skipped"]).removeprefix("built for ").split(" ")[0]
            machines[word] = machines.get(word, 0) + 1
        built = ", ".join(f"{n} for {m}" for m, n in sorted(machines.items()))
        note += (f"; skipped {len(foreign)} built for another machine than this interpreter's ({built}; e.g. "
                 f"{shown(foreign[0]['path'])}): not loadable here by construction")
    if driverless:
        note += (f"; {len(driverless)} {'needs' if len(driverless) == 1 else 'need'} the NVIDIA driver's libraries, absent on this host "
                 f"(e.g. {shown(driverless[0]['path'])}): not checkable here")
    if optional:
        needs: dict[str, int] = {}
        for _, names in optional:
            for name in names:
                needs[name] = needs.get(name, 0) + 1
        ranked = sorted(needs.items(), key=lambda item: (-item[1], item[0]))
        listed = ", ".join(f"{name} ({count})" for name, count in ranked[:8])
        listed += f" and {len(ranked) - 8} more" if len(ranked) > 8 else ""
        note += (f"; warning: {len(optional)} {'needs' if len(optional) == 1 else 'need'} host libraries that no distribution of the venv ships, absent "
                 f"here (optional plugins; objects needing each: {listed}; e.g. {shown(optional[0][0]['path'])})")
    if donor_too:
        note += _donor_note([f"{shown(lib['path'])}: {what}" for lib, what in donor_too])
    if failed:
        head = "; ".join(f"{shown(lib['path'])}: {what}" for lib, what in failed[:3])
        more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
        verb = "does not load" if len(failed) == 1 else "do not load"
        return "fail", f"{len(failed)} of {count(len(libraries), 'shared object')} {verb}: {head}{more}{note}"
    loaded = sum(1 for lib in libraries if lib.get("ok"))
    if not loaded:
        none = "the one shared object could not" if len(libraries) == 1 else f"none of {len(libraries)} shared objects could"
        return "skip", f"{none} be checked here{note}"
    return "pass", f"{loaded} of {count(len(libraries), 'shared object')} {'loads' if loaded == 1 else 'load'} (RTLD_NOW){note}"


def judge_provenance(report: Mapping[str, Any], shipped: Sequence[str]) -> tuple[str, str]:
    """(status, reason): fail on any :func:`provenance_conflicts`; else pass, counting the mapped
    libraries from the venv and from the system."""
    conflicts = provenance_conflicts(report, shipped)
    roots = [report.get("prefix", ""), report.get("prefix_real", "")]
    mapped = [m for m in report.get("mapped", []) if SHARED_OBJECT.search(m)]
    inside = [m for m in mapped if inside_roots(m, roots)]
    failed_imports = [i["name"] for i in report.get("imported", []) if not i.get("ok")]
    note = f"; could not import {', '.join(failed_imports)} (see imports)" if failed_imports else ""
    if conflicts:
        head = "; ".join(f"{c['library']} mapped from {c['mapped']} instead of the venv's {c['venv_copy']}: {c['why']}"
                         for c in conflicts[:3])
        more = f"; and {len(conflicts) - 3} more" if len(conflicts) > 3 else ""
        return "fail", f"{len(conflicts)} librar{'y' if len(conflicts) == 1 else 'ies'} from outside the venv: {head}{more}{note}"
    imported = [i["name"] for i in report.get("imported", []) if i.get("ok")]
    if not imported:
        return "skip", "nothing could be imported, so no library was mapped to check" + note
    return "pass", (f"after importing {', '.join(imported[:6])}{' ...' if len(imported) > 6 else ''}: "
                    f"{len(inside)} libraries mapped from the venv, {len(mapped) - len(inside)} from the system, "
                    f"none shadowing a library the venv ships{note}")



def judge_resolve(report: Mapping[str, Any]) -> tuple[str, str]:
    """(status, reason) for ``server_args.resolve``'s outcome (the ``resolve`` part of the
    server-args script's report).

    - the framework has no separate resolution step: skip, saying so;
    - it ran: pass;
    - it failed importing a module (``ImportError``): fail; the server could not start either;
    - it failed and ``<model_path>/config.json`` is absent on the target: skip, naming the file
      the step needs (with the error);
    - it failed, no GPU is visible and the error speaks of CUDA/GPU/device: skip, it needs a GPU;
    - any other failure: fail, with the error.
    """
    if not report.get("ran"):
        return "skip", str(report.get("error") or "no resolution step was run")
    method = report.get("method") or "the resolution step"
    if report.get("ok"):
        return "pass", f"{method}() ran: the arguments resolve against the model and platform"
    error = str(report.get("error"))
    kinds = set(report.get("kind") or ())
    if "ImportError" in kinds:
        return "fail", f"{method}() needs a module the venv lacks: {error}"
    model = report.get("model_path")
    if report.get("config_json") is False:
        return "skip", (f"{method}() needs the model's config.json, and {model}/config.json is absent on the "
                        f"target; put the model there to run it ({error})")
    if report.get("gpu") is not True and any(word in error.lower() for word in GPU_WORDS):
        return "skip", f"{method}() needs a GPU, and none is visible here ({error})"
    return "fail", f"{method}() failed: {error}"


def answer_at(answer: Any, path: str) -> Any:
    """The value at a dotted path in a decoded JSON answer (``choices.0.text``); None when absent."""
    value = answer
    for part in path.split(".") if path else ():
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def judge_serve(report: Mapping[str, Any], answer_path: str, *, max_tokens: int | None = None) -> tuple[str, str]:
    """(status, reason) for the serve script's report.

    The answer's shape: the value at ``answer_path`` must be a non-empty string, or a non-empty
    list (of at most ``max_tokens`` items when given: the tokens asked for).
    """
    stopped = f"; server {report.get('stopped')}" if report.get("stopped") else ""
    if not report.get("started"):
        tail = (report.get("log_tail") or "").strip().splitlines()[-1:] or [""]
        return "fail", f"{report.get('error')}; its log ends: {tail[0][:300]}{stopped}"
    if report.get("error"):
        return "fail", f"started in {report['startup_seconds']:.1f} s, then {report['error']}{stopped}"
    value = answer_at(report.get("answer"), answer_path)
    if value is None:
        return "fail", f"the answer has no {answer_path!r}: {str(report.get('answer'))[:300]}{stopped}"
    if not isinstance(value, (str, list)) or not value:
        return "fail", f"the answer's {answer_path} is {value!r}, expected a non-empty string or list{stopped}"
    if isinstance(value, list) and max_tokens is not None and len(value) > max_tokens:
        return "fail", f"the answer's {answer_path} has {len(value)} items, more than the {max_tokens} asked for{stopped}"
    shape = f"{len(value)} {'characters' if isinstance(value, str) else 'items'}"
    first = "streamed first token" if report.get("streamed") else "answer"
    return "pass", (f"started in {report['startup_seconds']:.1f} s; {first} after {report['first_token_seconds']:.2f} s; "
                    f"{answer_path}: {shape}{stopped}")


def stale_versions(cache: Mapping[str, Any]) -> list[str]:
    """The versions a cache's contents were built for that differ from the one installed
    (all of them when the library is not installed)."""
    installed = cache.get("installed")
    return [v for v in cache.get("versions", []) if v != installed]


def judge_jit_caches(caches: Sequence[Mapping[str, Any]], *, cleared: bool) -> tuple[str, str]:
    """(status, reason) for the JIT cache report.

    Pass, naming each existing folder and, as a warning, contents built for other versions
    than installed (a cache keyed by version is not reused, so it is stale weight rather than
    a fault; ``--clear-jit-caches=NAME`` removes it). A cache of a library this venv does not
    install gets no warning and no removal hint: the folder is per user (``~/.triton``,
    ``~/.cache/flashinfer``), so other venvs may use it. With ``cleared``, fail when a folder could
    not be removed.
    """
    parts, warnings, errors = [], [], []
    for c in caches:
        if not c.get("exists"):
            continue
        stale = stale_versions(c)
        built = f", built for {c.get('library', c['name'])} {', '.join(c['versions'])}" if c.get("versions") else ""
        library = c.get("library", c["name"])
        absent = "" if c.get("installed") or not c.get("versions") or c.get("removed") else \
            f"; {library} is not installed in this venv: a user-wide folder other venvs may use, left alone"
        parts.append(f"{c['name']} {c['path']} ({count(c['files'], 'file')}{built}{absent})"
                     + (" removed" if c.get("removed") else ""))
        if stale and c.get("installed") and not c.get("removed"):
            warnings.append(f"{c['name']} cache holds builds for {c.get('library', c['name'])} {', '.join(stale)} but "
                            f"{c.get('installed') or 'none'} is installed (--clear-jit-caches={c['name']} removes it)")
        if c.get("error"):
            errors.append(f"{c['path']}: {c['error']}")
    if errors and cleared:
        return "fail", "; ".join(errors)
    if not parts:
        return "pass", "no JIT cache folders exist (" + ", ".join(c["path"] for c in caches) + ")"
    tail = "".join(f"; warning: {w}" for w in warnings)
    return "pass", "; ".join(parts) + tail


#: How many of the CPU flags the target lacks an illegal instruction's reason names.
_FLAGS_SHOWN = 8


def cpu_level(flags: Collection[str] | None) -> str | None:
    """The highest x86-64 micro-architecture level (``x86-64-v3``...) whose features, with those
    of the levels below it, ``flags`` (``/proc/cpuinfo`` names) all has (``data/x86_levels.json``:
    the x86-64 psABI table); None for unknown flags (None) or a CPU below the baseline."""
    if flags is None:
        return None
    reached = None
    for level in x86_levels()["levels"]:
        if missing_flags(level, frozenset(flags)):
            break
        reached = level
    return reached


def name_cpu_gap(reason: str, target_flags: Collection[str] | None, donor_flags: Collection[str] | None) -> str:
    """``reason`` with its illegal instruction (:data:`ILLEGAL_INSTRUCTION`: a process killed by
    SIGILL, as the host scripts and the controller name it) said by the CPU flags the donor's CPU
    has and this one lacks: ``illegal instruction (SIGILL): the CPU lacks avx512f, avx512bw, ...
    (the donor's CPU has them; this CPU reaches x86-64-v3)``; the x86-64 levels' flags first (in
    the psABI table's order), then the others sorted, at most :data:`_FLAGS_SHOWN` named.

    :param target_flags: the target's CPU flags (the probe's ``host.cpu``), None when unknown.
    :param donor_flags: the donor's, None when unknown (a snapshot donor, an older probe): then
        the reason keeps the generic words and says the level this CPU reaches.
    :returns: ``reason`` unchanged when it names no illegal instruction or the target's flags
        are unknown. The donor's CPU lacking none of them is said too: the illegal instruction
        is then not a feature the donor's CPU has.
    """
    if ILLEGAL_INSTRUCTION not in reason or target_flags is None:
        return reason
    level = cpu_level(target_flags)
    reaches = f"this CPU reaches {level}" if level else "this CPU is below x86-64's baseline"
    if donor_flags is None:
        said = f"{ILLEGAL_INSTRUCTION} ({reaches}; the donor's CPU flags are unknown)"
    else:
        ordered = [f for flags in x86_levels()["levels"].values() for f in flags]
        lacking = sorted(set(donor_flags) - set(target_flags),
                         key=lambda f: (ordered.index(f) if f in ordered else len(ordered), f))
        if lacking:
            shown = ", ".join(lacking[:_FLAGS_SHOWN])
            more = f" and {len(lacking) - _FLAGS_SHOWN} more" if len(lacking) > _FLAGS_SHOWN else ""
            said = (f"illegal instruction (SIGILL): the CPU lacks {shown}{more}, which the donor's CPU has "
                    f"({reaches}; an object built for the donor's CPU)")
        else:
            said = f"{ILLEGAL_INSTRUCTION} (the donor's CPU has no flag this one lacks; {reaches})"
    return reason.replace(ILLEGAL_INSTRUCTION, said)
