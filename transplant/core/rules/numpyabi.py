"""``numpy-abi-mismatch``: extension modules built against NumPy 1.x that meet NumPy 2 after
apply (pure core).

NumPy 2 changed its C ABI: a module compiled with 1.x headers fails to initialise its C-API
under 2.x ("A module that was compiled using NumPy 1.x cannot be run in NumPy 2.x ...";
some packages only warn, so a plain import can pass and the first array crossing fails).
Metadata does not show it (torch declares no numpy requirement), the binaries do: NumPy's
``_import_array()`` names the module that holds the C-API table, ``numpy.core._multiarray_umath``
in 1.x headers, ``numpy._core._multiarray_umath`` (with the 1.x name as a fallback) in 2.x
headers (NumPy 2.0 migration guide, "NumPy 2.0 C-API and ABI"; the ELF script reads the
string: ``ElfFacts.numpy_abi``). Modules built with 2.x headers run on 1.x too (NumPy builds
them for an older target version by default), so only 1.x-built objects under numpy >= 2 are
reported. Objects whose fact was not read (an older recorded report) are not judged.
"""

from __future__ import annotations

from collections import defaultdict

from transplant.core.plan import Finding
from transplant.core.rules.env import DONOR_RUNS, EnvironmentAfter, describe, pip, severity
from transplant.core.units import agree, count

__all__ = ["numpy_findings"]

_SHOWN = 3


def numpy_findings(env: EnvironmentAfter) -> list[Finding]:
    """One finding per distribution whose shared objects were built with NumPy 1.x headers
    when the numpy after apply is 2.x or newer (``dists`` = the distribution and numpy;
    ``files`` = up to three objects). Severity by :func:`transplant.core.rules.env.severity`."""
    numpy = env.after.get("numpy")
    if numpy is None or numpy.version is None or numpy.version.major < 2:
        return []
    found: dict[str, list[str]] = defaultdict(list)
    for name in sorted(env.after):
        if name == "numpy":
            continue
        for facts in env.objects(name):
            if not facts.error and facts.numpy_abi == "1":
                found[name].append(facts.path)
    out = []
    donor_numpy = env.donor.latest().get("numpy")
    for name, paths in sorted(found.items()):
        dist = env.after[name]
        level = severity(env, [name, "numpy"], paths)
        theirs = env.donor.latest().get(name)
        witness = (f"; the donor runs it with {describe(donor_numpy)}" if name in env.overlaid and donor_numpy
                   else "")
        if level == "info":
            hint, why = "nothing to do", f"; {DONOR_RUNS}"
        elif (name in env.overlaid and "numpy" not in env.overlaid and donor_numpy is not None
              and donor_numpy.version is not None and donor_numpy.version.major < 2):
            hint, why = f"add 'numpy' to overlay in {env.manifest} (the donor has {describe(donor_numpy)})", ""
        elif name not in env.overlaid and theirs is not None and theirs.raw_version != dist.raw_version:
            hint, why = f"add {name!r} to overlay in {env.manifest} (the donor has {describe(theirs)})", ""
        else:
            hint, why = (f"install a build of {dist.display_name} made for NumPy 2, or keep NumPy 1.x: "
                         f"{pip(env.target.interpreter.prefix)} install 'numpy<2'"), ""
        out.append(Finding(
            code="numpy-abi-mismatch", severity=level, dists=(name, "numpy"),
            message=f"{describe(dist)}: {count(len(paths), 'shared object')} {agree(len(paths), 'was', 'were')} built against NumPy 1.x "
                    f"({agree(len(paths), 'it imports', 'they import')} "
                    f"numpy.core._multiarray_umath, e.g. {paths[0]}) and meet {describe(numpy)} after apply: "
                    f"\"A module that was compiled using NumPy 1.x cannot be run in NumPy 2.x\"{witness}{why}",
            hint=hint, files=tuple(paths[:_SHOWN]),
        ))
    return out
