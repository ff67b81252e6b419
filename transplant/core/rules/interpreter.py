"""Interpreter and platform rules: ``interpreter-missing``, ``python-abi-mismatch``,
``platform-mismatch`` (pure core).

Sources: wheel tags and their compatibility are PEP 425 / PEP 3149 (``EXT_SUFFIX``)
as computed by ``packaging.tags``; ``abi3`` is PEP 384; manylinux tags are PEP 513
(manylinux1 = glibc 2.5), PEP 571 (manylinux2010 = 2.12), PEP 599 (manylinux2014 = 2.17)
and PEP 600 (``manylinux_X_Y``); glibc symbol versions are the GNU ELF symbol
versioning of ``.gnu.version_r``.
"""

from __future__ import annotations

import re
import shlex

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.version import InvalidVersion, Version

from transplant.core.elf_facts import is_shared_object
from transplant.core.inventory import Distribution, Interpreter
from transplant.core.plan import Finding
from transplant.core.rules.env import DONOR_RUNS, EnvironmentAfter, describe, severity
from transplant.core.units import agree, count

__all__ = ["minor_blockers", "interpreter_findings", "python_abi_findings", "platform_findings", "unread_findings"]

_EXT = re.compile(r"\.(cpython-\d+[a-z]*)-[^/]*\.so$")
_MANYLINUX = re.compile(r"^manylinux_(\d+)_(\d+)_(.+)$")
_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_MACHINES = {"x86_64": "EM_X86_64", "amd64": "EM_X86_64", "aarch64": "EM_AARCH64", "arm64": "EM_AARCH64",
             "ppc64le": "EM_PPC64", "s390x": "EM_S390", "i686": "EM_386"}
_SHOWN = 8


def minor_blockers(dist: Distribution, donor_site: str, donor_minor: str, target: Interpreter) -> list[str]:
    """Why ``dist`` (a donor distribution, its files keyed by donor venv-relative paths) cannot move
    from a Python ``donor_minor`` venv to the CPython ``target`` of another minor; empty when it can.

    It can when it is pure Python: its WHEEL says ``Root-Is-Purelib: true`` (the wheel spec,
    PEP 427) and every tag has the ABI ``none`` and the platform ``any`` with at least one the
    target loads (PEP 425, ``packaging.tags.compatible_tags``); it has no shared object
    (extension module or library, by suffix); its dist-info folder and every file it lists lie in
    ``donor_site`` (moved to the same path below the target's site-packages: RECORD rows are
    relative to site-packages, so they stay valid) or outside the venv's ``lib``, in no folder
    named for the donor's minor (``include/site/python3.13``, another ``lib/python3.13``
    folder: data the target's Python does not look for there); no symlink names that minor;
    and its ``Requires-Python`` (PEP 345) admits the target's version. A requirement that does
    not parse counts as admitting it (``metadata-invalid`` says so).

    :param donor_site: the donor's site-packages, venv-relative (``lib/python3.13/site-packages``).
    :param donor_minor: ``3.13``. :returns: reasons in words, at most one of each kind.
    """
    reasons: list[str] = []
    tags = dist.wheel_tags
    if dist.root_is_purelib is not True or not tags:
        reasons.append("no WHEEL file says Root-Is-Purelib: true" if not tags or dist.root_is_purelib is None
                       else "its WHEEL says Root-Is-Purelib: false")
    elif not all(tag.abi == "none" and tag.platform == "any" for tag in tags):
        reasons.append(f"its WHEEL tags ({', '.join(sorted({str(t) for t in tags})[:4])}) name an ABI or a platform")
    else:
        version = (target.version.major, target.version.minor)
        if not set(tags) & set(compatible_tags(version, platforms=["any"])):
            reasons.append(f"its WHEEL tags ({', '.join(sorted({str(t) for t in tags})[:4])}) are not loadable by "
                           f"Python {target.minor}")
    shared = sorted(p for p in dist.files if is_shared_object(p))
    if shared:
        reasons.append(f"{count(len(shared), 'shared object')} ({', '.join(shared[:3])}"
                       f"{' ...' if len(shared) > 3 else ''})")
    site, segment = donor_site + "/", f"python{donor_minor}"
    if not dist.dist_info.startswith(site):
        reasons.append(f"its metadata folder {dist.dist_info} lies outside {donor_site}")
    specific = sorted(p for p in dist.files if not p.startswith(site) and (p.startswith("lib/") or segment in p.split("/")))
    if specific:
        reasons.append(f"{count(len(specific), 'file')} outside site-packages in a folder of the donor's Python "
                       f"({', '.join(specific[:3])}{' ...' if len(specific) > 3 else ''})")
    links = sorted(p for p, e in dist.files.items() if e.symlink is not None and segment in e.symlink.split("/"))
    if links:
        reasons.append(f"{count(len(links), 'symlink')} naming python{donor_minor} ({', '.join(links[:3])})")
    if dist.requires_python:
        try:
            admits = SpecifierSet(dist.requires_python).contains(target.version, prereleases=True)
        except InvalidSpecifier:
            admits = True
        if not admits:
            reasons.append(f"its Requires-Python {dist.requires_python} excludes {target.version}")
    return reasons


def interpreter_findings(env: EnvironmentAfter) -> list[Finding]:
    """``interpreter-missing``: the target's pyvenv.cfg ``home`` does not exist;
    ``python-version-mismatch``: the target runs another Python (implementation or
    ``major.minor``) than the donor, whose site-packages it does not read. Between two CPython
    minors the planner moves pure-Python distributions (:func:`minor_blockers`) into the
    target's site-packages (``env.relocated``): for them the finding is a warning (the target
    older than the donor: their code may use what it lacks) or info (newer); the overlaid
    distributions that cannot move are an error, naming why each cannot; another
    implementation blocks every overlaid distribution."""
    out = []
    t, d = env.target.interpreter, env.donor.interpreter
    if t.home_exists is False:
        home = (t.pyvenv_cfg or {}).get("home", "?")
        out.append(Finding(
            code="interpreter-missing", severity="error", dists=(),
            message=f"the target venv's pyvenv.cfg names home = {home}, which does not exist on "
                    f"{env.target.hostname}; the venv's python only starts by accident of its symlink",
            hint=f"repoint the venv at a Python {d.minor} that exists there: "
                 f"{shlex.join([f'python{d.minor}', '-m', 'venv', '--upgrade', t.prefix])}",
            files=("pyvenv.cfg",),
        ))
    if (d.implementation, d.minor) == (t.implementation, t.minor):
        return out
    names = (f"Python {d.minor} vs {t.minor}" if d.implementation == t.implementation
             else f"{d.implementation} {d.minor} vs {t.implementation} {t.minor}")
    recreate = (f"recreate the target venv with Python {d.minor}: "
                f"{shlex.join([f'python{d.minor}', '-m', 'venv', t.prefix])}")
    moved = [n for n in env.overlaid if n in env.relocated]
    blocked = [n for n in env.overlaid if n not in env.relocated]
    if blocked or not moved:
        why = ""
        if d.implementation == t.implementation == "cpython":
            reasons = {n: minor_blockers(env.after[n], env.donor.site_packages, d.minor, t) for n in blocked}
            why = "; ".join(f"{describe(env.after[n])}: {', '.join(reasons[n]) or 'not pure Python'}"
                            for n in blocked[:_SHOWN]) + (f"; and {len(blocked) - _SHOWN} more" if len(blocked) > _SHOWN else "")
            why = (f"; {count(len(blocked), 'overlaid distribution')} cannot move to another minor ({why}): "
                   f"only pure-Python distributions move, into the target's site-packages") if blocked else ""
        out.append(Finding(
            code="python-version-mismatch", severity="error" if blocked else "info", dists=tuple(blocked),
            message=f"{names}: the donor venv runs {d.implementation} {d.version}, the target venv "
                    f"{t.implementation} {t.version}; the donor's distributions live in {env.donor.site_packages}, "
                    f"which the target's Python does not read ({env.target.site_packages}), and extension modules "
                    f"built for {d.abi_tag} do not load on {t.abi_tag}" + (why or (
                        "; transplant moves only pure-Python distributions between two CPython minors"
                        if blocked else "; no distribution is overlaid, so none moves")),
            hint=(f"leave {', '.join(blocked)} out of overlay in {env.manifest} (install builds for Python {t.minor} "
                  f"on the target instead), or {recreate}") if blocked and d.implementation == t.implementation == "cpython"
                 else recreate if blocked else "nothing to do",
        ))
    if moved:
        older = t.version < d.version
        out.append(Finding(
            code="python-version-mismatch", severity="warning" if older else "info", dists=tuple(moved),
            message=f"{names}: {count(len(moved), 'pure-Python distribution')} ({', '.join(moved[:_SHOWN])}"
                    f"{' ...' if len(moved) > _SHOWN else ''}) {agree(len(moved), 'moves', 'move')} from the donor's "
                    f"{env.donor.site_packages} to the target's {env.target.site_packages}, each file to the same path "
                    f"below it (RECORD's rows are relative to it and stay valid; console scripts get the target's "
                    f"interpreter); their bytecode caches for Python {d.minor} "
                    f"(__pycache__/*.cpython-{d.version.major}{d.version.minor}.pyc) are copied as RECORD lists them and Python {t.minor} ignores them, compiling its own"
                    + (f"; code the donor runs on Python {d.minor} may use language or standard-library features "
                       f"{t.minor} lacks, which their Requires-Python does not exclude" if older else ""),
            hint=f"after apply, import them on the target: transplant verify {shlex.quote(env.manifest)}"
                 if older else "nothing to do",
        ))
    return out


def _loadable(env: EnvironmentAfter) -> set[tuple[str, str]]:
    """(interpreter, abi) pairs the target interpreter loads (packaging.tags, platform ignored)."""
    t = env.target.interpreter
    version = (t.version.major, t.version.minor)
    pairs = {(tag.interpreter, tag.abi) for tag in cpython_tags(version, platforms=["any"])}
    pairs |= {(tag.interpreter, tag.abi) for tag in compatible_tags(version, platforms=["any"])}
    return pairs


def python_abi_findings(env: EnvironmentAfter) -> list[Finding]:
    """``python-abi-mismatch``: an overlaid distribution whose WHEEL tags or extension-module
    suffixes (``.cpython-311-x86_64-linux-gnu.so``) the target interpreter cannot load;
    ``abi3`` and ``none`` tags load on any newer CPython 3."""
    t = env.target.interpreter
    if t.implementation != "cpython":
        return []
    loadable, out = _loadable(env), []
    own = _EXT.search(f"x{t.ext_suffix or ''}")
    for name in env.overlaid:
        dist = env.after[name]
        bad_tags = [] if any((tag.interpreter, tag.abi) in loadable for tag in dist.wheel_tags) else \
            sorted({str(tag) for tag in dist.wheel_tags})
        bad_files = [p for p in sorted(dist.files) if (m := _EXT.search(p)) and own and m.group(1) != own.group(1)]
        if not bad_tags and not bad_files:
            continue
        what = []
        if bad_tags:
            what.append(f"its WHEEL tags ({', '.join(bad_tags[:4])}) are not loadable by {t.abi_tag}")
        if bad_files:
            what.append(f"{count(len(bad_files), 'extension module')} {agree(len(bad_files), 'ends', 'end')} in another ABI suffix "
                        f"than {t.ext_suffix}")
        if env.same_interpreter:  # the donor's own bytes on the donor's Python: whatever loads them there loads them here
            out.append(Finding(
                code="python-abi-mismatch", severity="info", dists=(name,),
                message=f"{describe(dist)}: " + "; ".join(what) + f"; {DONOR_RUNS} (the donor runs Python "
                        f"{env.donor.interpreter.version}, the target {t.version})",
                hint="nothing to do", files=tuple(bad_files[:_SHOWN]),
            ))
            continue
        out.append(Finding(
            code="python-abi-mismatch", severity=severity(env, [name], donor=False), dists=(name,),
            message=f"{describe(dist)} from the donor: " + "; ".join(what) + f" (target Python {t.version})",
            hint=f"remove {name!r} from overlay in {env.manifest} and install a {t.abi_tag} build on the target: "
                 f"{shlex.join([f'{t.prefix}/bin/python', '-m', 'pip', 'install', f'{dist.display_name}=={dist.raw_version}'])}",
            files=tuple(bad_files[:_SHOWN]),
        ))
    return out


def _glibc(text: str | None) -> Version | None:
    try:
        return Version(text) if text else None
    except InvalidVersion:
        return None


def _tag_platform_problem(tag: Tag, machine: str, glibc: Version | None) -> str | None:
    """Why the target cannot run a wheel built for ``tag``'s platform, or None if it can."""
    plat = tag.platform
    if plat == "any":
        return None
    match = _MANYLINUX.match(plat)
    legacy = next((v for k, v in _LEGACY.items() if plat.startswith(k + "_")), None)
    if match or legacy is not None:
        need = (int(match.group(1)), int(match.group(2))) if match else legacy
        assert need is not None  # no match: the legacy name was found
        arch = match.group(3) if match else plat.split("_", 1)[1]
        if arch != machine:
            return f"{plat} is for {arch}, the target is {machine}"
        if glibc is not None and Version(f"{need[0]}.{need[1]}") > glibc:
            return f"{plat} needs glibc {need[0]}.{need[1]}, the target has {glibc}"
        return None
    if plat.startswith("musllinux_"):
        return f"{plat} needs musl libc, the target has glibc {glibc}" if glibc is not None else None
    if plat.startswith("linux_"):
        arch = plat[len("linux_"):]
        return None if arch == machine else f"{plat} is for {arch}, the target is {machine}"
    return f"{plat} is not a Linux platform"


def _elf_problems(env: EnvironmentAfter, name: str, machine: str, glibc: Version | None) -> list[tuple[str, bool]]:
    """(problem, whether the donor has it identically) for each overlaid shared object the
    target cannot run: another machine type (the donor, of the same machine type, carries
    the same bytes, so it cannot run them either), or symbol versions the target's glibc or
    libstdc++ lacks (the donor's glibc lacking them too counts as the donor's)."""
    report = env.target_elf
    donor_glibc = _glibc(env.donor.interpreter.glibc)
    same_machine = env.donor.interpreter.machine == machine
    cxx = set(report.libstdcxx.versions) if report is not None and report.libstdcxx is not None else None
    want = _MACHINES.get(machine)
    problems = []
    for facts in env.objects(name):
        if facts.error:
            continue
        if want and facts.machine and facts.machine != want:
            problems.append((f"{facts.path} is {facts.machine}, the target is {want}", same_machine))
            continue
        needs = sorted({v for names in facts.version_needs.values() for v in names})
        too_new = [v for v in needs if v.startswith("GLIBC_") and glibc is not None
                   and (ver := _glibc(v[len("GLIBC_"):])) is not None and ver > glibc]
        donor_lacks = bool(too_new) and donor_glibc is not None and all(
            (ver := _glibc(v[len("GLIBC_"):])) is not None and ver > donor_glibc for v in too_new)
        if cxx is not None:
            cxx_new = [v for v in needs if v.startswith(("GLIBCXX_", "CXXABI_")) and v not in cxx]
            too_new += cxx_new
            donor_lacks = donor_lacks and not cxx_new  # the donor's libstdc++ is not read: no claim for it
        if too_new:
            problems.append((f"{facts.path} needs {', '.join(too_new[:4])}", donor_lacks))
    return problems


def platform_findings(env: EnvironmentAfter) -> list[Finding]:
    """``platform-mismatch``: overlaid distributions whose shared objects the target cannot
    run: another machine type, glibc / libstdc++ symbol versions the target's libraries do
    not define, or a manylinux tag above the target's glibc."""
    t = env.target.interpreter
    glibc = _glibc(t.glibc)
    cxx_lib = env.target_elf.libstdcxx.path if env.target_elf and env.target_elf.libstdcxx else "libstdc++.so.6"
    out = []
    for name in env.overlaid:
        dist = env.after[name]
        problems: list[str] = []
        if dist.wheel_tags:
            tag_problems = [_tag_platform_problem(tag, t.machine, glibc) for tag in dist.wheel_tags]
            if all(tag_problems):
                problems.append(sorted({p for p in tag_problems if p is not None})[0])  # all of them said why
        elf = _elf_problems(env, name, t.machine, glibc)
        carried = [p for p, donor_has in elf if donor_has] if env.donor.interpreter.machine == t.machine else []
        problems += [p for p, donor_has in elf if p not in carried]
        if carried:
            out.append(Finding(
                code="platform-mismatch", severity="info", dists=(name,),
                message=f"{describe(dist)}: {count(len(carried), 'shared object')} the {t.machine} target cannot load, "
                        f"carried identically by the {env.donor.interpreter.machine} donor, which cannot load "
                        f"{agree(len(carried), 'it', 'them')} "
                        f"either (cross-compile stubs, optional variants): " + "; ".join(carried[:3])
                        + (f"; and {len(carried) - 3} more" if len(carried) > 3 else "") + "; nothing in the donor "
                        "loads them, so nothing here will",
                hint="nothing to do",
                files=tuple(p.split(" ", 1)[0] for p in carried[:_SHOWN]),
            ))
        if not problems:
            continue
        out.append(Finding(
            code="platform-mismatch", severity=severity(env, [name], donor=False), dists=(name,),
            message=f"{describe(dist)} from the donor cannot run on the target ({t.machine}, glibc {t.glibc}, "
                    f"{cxx_lib}): " + "; ".join(problems[:_SHOWN])
                    + (f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""),
            hint=f"remove {name!r} from overlay in {env.manifest} and install a build for the target's platform "
                 f"there: {shlex.join([f'{t.prefix}/bin/python', '-m', 'pip', 'install', f'{dist.display_name}=={dist.version.public if dist.version else dist.raw_version}'])}"
                 f" (or upgrade the target's OS to glibc/libstdc++ at least as new as the donor's)",
            files=tuple(p.split(" ", 1)[0] for p in problems if "/" in p.split(" ", 1)[0])[:_SHOWN],
        ))
    return out


def unread_findings(env: EnvironmentAfter) -> list[Finding]:
    """``binary-unreadable``: overlaid shared objects the ELF reader could not read (not ELF,
    truncated, refused) or read only in part; the binary checks did not cover them, and
    the plan says so rather than passing them silently."""
    out = []
    for name in env.overlaid:
        dist = env.after[name]
        problems = [f"{f.path}: {f.error}" for f in env.objects(name) if f.error]
        problems += [f"{f.path}: {note}" for f in env.objects(name) for note in f.notes]
        if not problems:
            continue
        out.append(Finding(
            code="binary-unreadable", severity="warning", dists=(name,),
            message=f"{describe(dist)}: {count(len(problems), 'shared object')} could not be read (fully) as ELF, so the "
                    f"platform, CUDA and libtorch checks did not cover {agree(len(problems), 'it', 'them')}: " + "; ".join(problems[:3])
                    + (f"; and {len(problems) - 3} more" if len(problems) > 3 else ""),
            hint=f"reinstall {dist.display_name} on the donor from its wheel, or check those files by hand "
                 f"(readelf -d FILE)",
            files=tuple(p.split(": ", 1)[0] for p in problems[:_SHOWN]),
        ))
    return out
