"""Pure-core tests of the compatibility gate: each kind of fault built as data, asserted by
code, severity and hint; the same environment without the fault gives no such finding.
Numbered cases are the issue's cases from public reports."""

from __future__ import annotations

import posixpath

import pytest

from inventory_docs import SITE, digest, dist, document
from transplant.core.elf_facts import DeviceCode, ElfFacts, ElfReport, LibraryVersions
from transplant.core.inventory import parse_inventory
from transplant.core.manifest import parse_manifest
from transplant.core.planner import PatchFile, plan
from transplant.core.rules.cudarules import covers

DONOR, TARGET = "/donor/venv", "/target/venv"
NV_H100 = {"available": True, "driver_version": "580.95.05", "cuda_version": "13.0",
           "gpus": [{"name": "NVIDIA H100 80GB HBM3", "compute_capability": "9.0", "memory_mib": 81559}]}


def manifest(overlay, **extra):
    data = {"version": 1, "donor": {"host": "root@ct129", "venv": DONOR},
            "target": {"host": "root@ct200", "venv": TARGET}, "overlay": overlay, **extra}
    return parse_manifest(data, path="m.yaml")


def inv(dists, prefix, **kw):
    return parse_inventory(document(prefix, dists, **kw), label=f"h:{prefix}")


def found(result, code):
    return [f for f in result.findings if f.code == code]


def run(overlay, donor_dists, target_dists, *, donor_kw=None, target_kw=None, patches=(), donor_elf=None,
        target_elf=None, **extra):
    donor = inv(donor_dists, DONOR, **(donor_kw or {}))
    target = inv(target_dists, TARGET, **(target_kw or {}))
    return plan(manifest(overlay, **extra), donor, target, patches, donor_elf=donor_elf, target_elf=target_elf)


def elf(label, *facts, defined=None, libstdcxx=None):
    return ElfReport(label=label, files={f.path: f for f in facts}, defined=defined or {},
                     libstdcxx=libstdcxx)


def so(path, **kw):
    return ElfFacts(path=f"{SITE}/{path}", machine=kw.pop("machine", "EM_X86_64"), elf_class=64, **kw)


# --- interpreter-missing (case 1) -------------------------------------------------------------

def test_case1_target_home_missing():
    result = run(["a"], [dist("a", "1", {"a.py": "x"})], [], target_kw={"home_exists": False})
    [f] = found(result, "interpreter-missing")
    assert f.severity == "error" and f.files == ("pyvenv.cfg",)
    assert "home = /usr/bin, which does not exist" in f.message
    assert f.hint == "repoint the venv at a Python 3.11 that exists there: python3.11 -m venv --upgrade /target/venv"
    assert not found(run(["a"], [dist("a", "1", {"a.py": "x"})], []), "interpreter-missing")


def test_other_python_version_than_the_donor():
    result = run(["a"], [dist("a", "1", {"a.py": "x"})], [], target_kw={"python": "3.12.3"})
    assert not found(result, "interpreter-missing")
    [f] = found(result, "python-version-mismatch")
    assert f.severity == "error" and f.message.startswith("Python 3.11 vs 3.12: the donor venv runs cpython 3.11.7, "
                                                          "the target venv cpython 3.12.3")
    assert "a 1: its WHEEL says Root-Is-Purelib: false" in f.message and f.dists == ("a",)
    assert f.hint == ("leave a out of overlay in m.yaml (install builds for Python 3.12 on the target instead), or "
                      "recreate the target venv with Python 3.11: python3.11 -m venv /target/venv")


# --- script-prefix (case 2) -------------------------------------------------------------------

def test_case2_console_script_shebang_is_rewritten():
    donor_script = "#!/donor/venv/bin/python\nimport x; x.main()\n"
    result = run(["x"], [dist("x", "1", {"x/__init__.py": "x"}, scripts={"x": donor_script})], [])
    [f] = found(result, "script-prefix")
    assert f.severity == "info" and f.files == ("bin/x",)
    assert "1 console script starts with the donor's interpreter" in f.message
    assert "apply rewrites its first line to /target/venv/bin/python" in f.message
    assert f.hint == "nothing to do: apply rewrites them (and verify checks the result)"
    [copy] = [c for c in result.changes[0].copy if c.path == "bin/x"]
    assert copy.head == "#!/target/venv/bin/python\n" and copy.body_hash == digest("import x; x.main()\n")
    # a second plan against a target that already has the rewritten script copies nothing
    done = dist("x", "1", {"x/__init__.py": "x"}, scripts={"x": "#!/target/venv/bin/python\nimport x; x.main()\n"})
    again = run(["x"], [dist("x", "1", {"x/__init__.py": "x"}, scripts={"x": donor_script})], [done])
    assert [c.path for c in again.changes[0].copy if c.path == "bin/x"] == []



def test_record_of_relocated_scripts_is_compared_by_its_normalised_identity():
    """Issue 13: apply sets the RECORD rows of the scripts it relocates; the plan says which,
    and a target whose RECORD is the donor's with only those rows set is left alone."""
    donor_script, moved = "#!/donor/venv/bin/python\nimport x; x.main()\n", "#!/target/venv/bin/python\nimport x; x.main()\n"
    record = f"{SITE}/x-1.dist-info/RECORD"

    def x(script, rows=None, identity="record:sha256=same", **kw):
        return dist("x", "1", {"x/__init__.py": "x"}, scripts={"x": script}, script_rows=rows,
                    record_identity=identity, **kw)

    [copy] = [c for c in run(["x"], [x(donor_script)], []).changes[0].copy if c.path == record]
    assert (copy.record_identity, copy.record_scripts, copy.identity) == (
        "record:sha256=same", ("bin/x",), "record:sha256=same")
    applied = run(["x"], [x(donor_script)], [x(moved)])                 # rows set by apply: nothing to do
    assert applied.changes[0].action == "keep" and not found(applied, "record-drift")
    older = run(["x"], [x(donor_script)], [x(moved, rows={"x": donor_script})])  # the donor's row kept
    assert not found(older, "record-drift")                             # the script is apply's, not an edit
    assert [(c.path, c.record_scripts) for c in older.changes[0].copy] == [(record, ("bin/x",))]
    other = run(["x"], [x(donor_script)], [x(moved, identity="record:sha256=other")])
    assert [c.path for c in other.changes[0].copy] == [record]
    edited = run(["x"], [x(donor_script)], [x(moved + "# local\n", rows={"x": moved})])  # a hand edit: reported
    [f] = found(edited, "record-drift")
    assert f.files == ("bin/x",) and "on the target" in f.message
    assert sorted(c.path for c in edited.changes[0].copy) == ["bin/x", record]
    portable = run(["x"], [x("#!/usr/bin/env python3\npass\n")], [])  # nothing relocated: verbatim
    assert [c.record_identity for c in portable.changes[0].copy if c.path == record] == [None]

def test_script_prefix_names_the_interpreter_the_shebang_names():
    result = run(["x"], [dist("x", "1", {"x/__init__.py": "x"},
                              scripts={"x": "#!/donor/venv/bin/python3\nimport x\n"})], [])
    [f] = found(result, "script-prefix")
    assert "the donor's interpreter /donor/venv/bin/python3;" in f.message, f.message
    assert f.message.endswith("rewrites its first line to /target/venv/bin/python3"), f.message


def test_portable_shebang_is_not_a_finding():
    result = run(["x"], [dist("x", "1", {"x/__init__.py": "x"}, scripts={"x": "#!/usr/bin/env python3\npass\n"})], [])
    assert not found(result, "script-prefix")
    assert [c.head for c in result.changes[0].copy if c.path == "bin/x"] == [None]


# --- editable-install (case 3) ----------------------------------------------------------------

FINDER = ("import sys\nMAPPING: dict[str, str] = {'sglang': '/donor/src/python/sglang'}\n"
          "NAMESPACES: dict[str, list[str]] = {}\n")


def editable_sglang():
    return dist("sglang", "0.5.23", {"__editable___sglang_0_5_23_finder.py": FINDER,
                                     "__editable__.sglang-0.5.23.pth": "import __editable___sglang_0_5_23_finder\n"},
                direct_url={"url": "file:///donor/src/python", "dir_info": {"editable": True}})


def test_case3_editable_install_whose_source_is_absent_on_the_target():
    texts = {"__editable___sglang_0_5_23_finder.py": FINDER,
             "__editable__.sglang-0.5.23.pth": "import __editable___sglang_0_5_23_finder\n"}
    result = run(["sglang"], [editable_sglang()], [], donor_kw={"texts": texts},
                 target_kw={"elsewhere": {"/donor/src/python": False, "/donor/src/python/sglang": False}})
    [f] = found(result, "editable-install")
    assert f.severity == "error" and f.files == ("/donor/src/python", "/donor/src/python/sglang")
    assert f.hint.startswith("reinstall it from its source as a regular install on the donor: "
                             "/donor/venv/bin/python -m pip install --no-deps --force-reinstall /donor/src/python")
    present = run(["sglang"], [editable_sglang()], [], donor_kw={"texts": texts},
                  target_kw={"elsewhere": {"/donor/src/python": True, "/donor/src/python/sglang": True}})
    assert [f.severity for f in found(present, "editable-install")] == ["info"]
    regular = run(["sglang"], [dist("sglang", "0.5.23", {"sglang/__init__.py": "s"})], [])
    assert not found(regular, "editable-install")
    # a finder whose MAPPING is code, not data, is never run: the plan says it could not check
    hostile = {**texts, "__editable___sglang_0_5_23_finder.py": "MAPPING = __import__('os').system('touch /x')\n"}
    hostile_plan = run(["sglang"], [editable_sglang()], [], donor_kw={"texts": hostile})
    [f] = [f for f in found(hostile_plan, "editable-install") if f.severity == "warning"]
    assert "could not be read as data" in f.message and "MAPPING" in f.message


# --- record-drift (case 4) --------------------------------------------------------------------

def test_case4_undeclared_hand_edit_on_the_donor():
    edited = dist("sglang", "0.5.23", {"sglang/srt/x.py": "A"}, on_disk={"sglang/srt/x.py": "B"})
    [f] = found(run(["sglang"], [edited], []), "record-drift")
    assert f.severity == "warning" and f.files == (f"{SITE}/sglang/srt/x.py",)
    assert "patches: [{source: patches/sglang/srt/x.py, dest: sglang/srt/x.py}]" in f.hint
    declared = run(["sglang"], [edited], [], patches=[PatchFile(local="p/x.py", dest="sglang/srt/x.py",
                                                                 hash=digest("B"), size=1)])
    assert not found(declared, "record-drift")
    clean = run(["sglang"], [dist("sglang", "0.5.23", {"sglang/srt/x.py": "A"})], [])
    assert not found(clean, "record-drift")


def test_local_edit_on_the_target_is_reported_before_it_is_overwritten():
    target = dist("sglang", "0.5.9", {"sglang/srt/x.py": "A"}, on_disk={"sglang/srt/x.py": "edited"})
    [f] = found(run(["sglang"], [dist("sglang", "0.5.23", {"sglang/srt/x.py": "new"})], [target]), "record-drift")
    assert "on the target" in f.message and f.hint == "to keep an edit, declare it as a patch in m.yaml"


# --- duplicate-dist-info (case 5) -------------------------------------------------------------

def stale_torch():
    entry = dist("torch", "2.8.0+cu128", {}, dist_info="torch-2.8.0+cu128.dist-info", metadata=False)
    entry.update(record=None, listing=["REQUESTED"])
    return entry


def test_case5_leftover_dist_info_is_reported_and_apply_leaves_one():
    complete = dist("torch", "2.9.0+cu128", {"torch/__init__.py": "t"}, dist_info="torch-2.9.0+cu128.dist-info")
    result = run(["torch"], [dist("torch", "2.9.0+cu128", {"torch/__init__.py": "t"})], [complete, stale_torch()])
    [f] = found(result, "duplicate-dist-info")
    assert f.severity == "warning" and f.hint == "apply replaces them with the donor's one"
    [change] = [c for c in result.changes if c.name == "torch"]
    assert f"{SITE}/torch-2.8.0+cu128.dist-info/REQUESTED" in change.remove
    assert not any(p.startswith(f"{SITE}/torch-2.9.0+cu128.dist-info/") for p in change.remove)
    untouched = run(["a"], [dist("a", "1", {"a.py": "a"})], [complete, stale_torch()])
    [f] = found(untouched, "duplicate-dist-info")
    assert f.hint == "add 'torch' to overlay, or reinstall it: /target/venv/bin/python -m pip install --force-reinstall torch"
    assert not found(run(["torch"], [dist("torch", "2.9.0", {"t.py": "t"})], [complete]), "duplicate-dist-info")


# --- python-abi-mismatch (case 6) -------------------------------------------------------------

def test_case6_cp311_extension_into_a_312_venv():
    torch = dist("torch", "2.9.0+cu128", {"torch/_C.cpython-311-x86_64-linux-gnu.so": "so"},
                 tags=["cp311-cp311-manylinux_2_28_x86_64"])
    result = run(["torch"], [torch], [], target_kw={"python": "3.12.3"})
    [f] = found(result, "python-abi-mismatch")
    assert f.severity == "error" and f.files == (f"{SITE}/torch/_C.cpython-311-x86_64-linux-gnu.so",)
    assert "cp311-cp311-manylinux_2_28_x86_64" in f.message
    assert f.hint.startswith("remove 'torch' from overlay in m.yaml and install a cp312 build on the target")
    abi3 = dist("sgl-kernel", "0.3.16", {"sgl_kernel/common_ops.abi3.so": "so"}, tags=["cp310-abi3-manylinux_2_28_x86_64"])
    assert not found(run(["sgl-kernel"], [abi3], [], target_kw={"python": "3.12.3"}), "python-abi-mismatch")
    assert not found(run(["torch"], [torch], []), "python-abi-mismatch")


def test_cuda_major_of_a_staying_library_identical_to_the_donors_is_info():
    """torch_memory_saver 0.0.10 left on the target by an earlier apply, byte-identical to the donor's,
    needs libcudart.so.12 beside the CUDA 13 torch: the donor (built around CUDA 13) runs it so, even
    though only the target's side of its ELF facts was read."""
    tms = dist("torch-memory-saver", "0.0.10", {"tms/hook.so": "h"})
    donor = [dist("torch", "2.14.1+cu130", {"t.py": "t2"}), tms]
    target_elf = elf("t", so("tms/hook.so", needed=("libcudart.so.12",)))
    [f] = found(run(["torch"], donor, [dist("torch", "2.9.1+cu128", {"t.py": "t1"}), tms], target_elf=target_elf),
                "cuda-major-mismatch")
    assert f.severity == "info" and f.dists == ("torch-memory-saver",)
    other = dist("torch-memory-saver", "0.0.10", {"tms/hook.so": "rebuilt"})
    [f] = found(run(["torch"], donor, [dist("torch", "2.9.1+cu128", {"t.py": "t1"}), other], target_elf=target_elf),
                "cuda-major-mismatch")
    assert f.severity == "error"


def test_relocated_console_scripts_do_not_make_a_distribution_differ_from_the_donors():
    from transplant.core.rules.env import EnvironmentAfter

    donor = inv([dist("torch", "2.14.1", {"t.py": "t"}, scripts={"torchrun": f"#!{DONOR}/bin/python\nrun()\n"})], DONOR)
    target = inv([dist("torch", "2.14.1", {"t.py": "t"}, scripts={"torchrun": f"#!{TARGET}/bin/python\nrun()\n"})],
                 TARGET)
    env = EnvironmentAfter(donor=donor, target=target, overlaid=(), after=target.latest())
    assert env.donor_identical("torch")
    edited = inv([dist("torch", "2.14.1", {"t.py": "edited"})], TARGET)
    assert not EnvironmentAfter(donor=donor, target=edited, overlaid=(), after=edited.latest()).donor_identical("torch")


def test_python_abi_of_the_donors_own_bytes_on_the_donors_python_is_info():
    """sglang-kernel 0.4.10 ships sgl_kernel/infllm_ops.cpython-310-...so (its only build, loaded by
    path) and runs on the 3.11 donor: on a 3.11 target of the same machine and glibc it is no fault."""
    kernel = dist("sglang-kernel", "0.4.10", {"sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so": "so",
                                              "sgl_kernel/common_ops.abi3.so": "k"})
    [f] = found(run(["sglang-kernel"], [kernel], []), "python-abi-mismatch")
    assert f.severity == "info" and f.files == (f"{SITE}/sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so",)
    # an older glibc on the target changes nothing: the suffix is the venv's, the Python the same
    [f] = found(run(["sglang-kernel"], [kernel], [], target_kw={"glibc": "2.31"}), "python-abi-mismatch")
    assert f.severity == "info" and "does not change with the host's system" in f.message
    # another Python on the target: the donor's Python no longer vouches for them
    [f] = found(run(["sglang-kernel"], [kernel], [], target_kw={"python": "3.12.3"}), "python-abi-mismatch")
    assert f.severity == "error"


# --- platform-mismatch ------------------------------------------------------------------------

def test_manylinux_tag_above_the_target_glibc():
    wheel = dist("a", "1", {"a/x.so": "so"}, tags=["cp311-cp311-manylinux_2_34_x86_64"])
    [f] = found(run(["a"], [wheel], [], target_kw={"glibc": "2.31"}), "platform-mismatch")
    assert f.severity == "error" and "manylinux_2_34_x86_64 needs glibc 2.34, the target has 2.31" in f.message
    assert f.hint.startswith("remove 'a' from overlay in m.yaml and install a build for the target's platform there: "
                             "/target/venv/bin/python -m pip install a==1")
    assert not found(run(["a"], [wheel], [], target_kw={"glibc": "2.36"}), "platform-mismatch")


def test_symbol_versions_and_machine_read_from_the_binaries():
    wheel = dist("a", "1", {"a/x.so": "so", "a/y.so": "so", "a/z.so": "so"})
    donor_elf = elf("d", so("a/x.so", needed=("libc.so.6",), version_needs={"libc.so.6": ("GLIBC_2.2.5", "GLIBC_2.33")}),
                    so("a/y.so", machine="EM_AARCH64"),
                    so("a/z.so", version_needs={"libstdc++.so.6": ("GLIBCXX_3.4.32",)}))
    target_elf = elf("t", libstdcxx=LibraryVersions(path="/usr/lib/libstdc++.so.6", versions=("GLIBCXX_3.4.30",)))
    f, carried = found(run(["a"], [wheel], [], target_kw={"glibc": "2.31"}, donor_elf=donor_elf,
                           target_elf=target_elf), "platform-mismatch")
    assert f.severity == "error" and f.files == (f"{SITE}/a/x.so", f"{SITE}/a/z.so")
    assert f"{SITE}/a/x.so needs GLIBC_2.33" in f.message
    assert f"{SITE}/a/z.so needs GLIBCXX_3.4.32" in f.message
    # the AArch64 object is carried identically by the x86_64 donor, which cannot load it either
    assert carried.severity == "info" and carried.files == (f"{SITE}/a/y.so",)
    assert f"{SITE}/a/y.so is EM_AARCH64, the target is EM_X86_64" in carried.message
    fine = elf("d", so("a/x.so", version_needs={"libc.so.6": ("GLIBC_2.2.5",)}))
    assert not found(run(["a"], [wheel], [], donor_elf=fine, target_elf=target_elf), "platform-mismatch")


def test_platform_the_donor_carries_is_info_only_in_its_own_context():
    wheel = dist("a", "1", {"a/x.so": "so", "a/y.so": "so"})
    donor_elf = elf("d", so("a/x.so", version_needs={"libc.so.6": ("GLIBC_2.38",)}), so("a/y.so", machine="EM_AARCH64"))
    # the donor's glibc lacks GLIBC_2.38 too, and it is x86_64 like the target: both facts are the donor's own
    [f] = found(run(["a"], [wheel], [], donor_kw={"glibc": "2.36"}, target_kw={"glibc": "2.36"},
                    donor_elf=donor_elf, target_elf=elf("t")), "platform-mismatch")
    assert f.severity == "info" and len(f.files) == 2
    # an AArch64 donor really runs its AArch64 object: on an x86_64 target that is an error
    [f] = found(run(["a"], [wheel], [], donor_kw={"machine": "aarch64", "glibc": "2.38"}, donor_elf=donor_elf,
                    target_elf=elf("t")), "platform-mismatch")
    assert f.severity == "error" and f"{SITE}/a/y.so is EM_AARCH64" in f.message


# --- cuda-variant-mismatch (case 7) -----------------------------------------------------------

@pytest.mark.parametrize("torch_v, vision_v, why, spec", [
    ("2.2.1+cpu", "0.17.1", "torch is a CPU-only build (+cpu) and torchvision a CUDA 12.1 build", "torchvision==0.17.1"),
    ("2.9.0+cu128", "0.24.0+cu130", "torch is a CUDA 12.8 build (+cu128) and torchvision a CUDA 13.0 build",
     "torchvision==0.24.0"),
    ("2.13.0+cpu", "0.16.2+cpu", "torch 2.13 pairs with torchvision 0.28.x, not 0.16.2+cpu", "'torchvision==0.28.*'"),
])


def test_case7_torch_family_from_other_builds(torch_v, vision_v, why, spec):
    result = run(["torchvision"], [dist("torchvision", vision_v, {"torchvision/_C.so": "v"})],
                 [dist("torch", torch_v, {"torch/__init__.py": "t"})])
    [f] = found(result, "cuda-variant-mismatch")
    assert f.severity == "error" and why in f.message and f.dists == ("torch", "torchvision")
    variant = torch_v.split("+")[1]
    assert f.hint == (f"install the matching build: /target/venv/bin/python -m pip install {spec} "
                      f"--index-url https://download.pytorch.org/whl/{variant}")


def test_case7_matching_torch_family_is_quiet():
    result = run(["torchvision"], [dist("torchvision", "0.17.1+cpu", {"torchvision/_C.so": "v"})],
                 [dist("torch", "2.2.1+cpu", {"torch/__init__.py": "t"})])
    assert not found(result, "cuda-variant-mismatch")


def test_torch_family_fault_already_on_the_target_is_a_warning():
    result = run(["a"], [dist("a", "1", {"a.py": "a"})],
                 [dist("torch", "2.2.1+cpu", {"t.py": "t"}), dist("torchvision", "0.17.1", {"v.py": "v"})])
    assert [f.severity for f in found(result, "cuda-variant-mismatch")] == ["warning"]


def _torch_stack(torch_v, **companions):
    """torch plus companions given as name -> (version, [Requires-Dist])."""
    return [dist("torch", torch_v, {"torch/__init__.py": "t" + torch_v})] + [
        dist(n, v, {f"{n}/_C.so": n + v}, requires=reqs) for n, (v, reqs) in companions.items()]


def test_cuda_variant_companion_torch_2_14_with_torchaudio_2_11_is_no_error():
    # sglang 0.5.23 pins torch==2.14.1 and torchaudio==2.11.0; torchaudio 2.11.0 declares no torch
    # requirement and the registry has no torchaudio 2.14: nothing says this pair is wrong
    real = _torch_stack("2.14.1", torchaudio=("2.11.0", []), torchvision=("0.29.1", ["torch>=2.14.0"]))
    assert not found(run(["a"], [dist("a", "1", {"a.py": "a"})], real), "cuda-variant-mismatch")
    old = _torch_stack("2.9.1", torchaudio=("2.9.1", ["torch==2.9.1"]), torchvision=("0.24.1", ["torch==2.9.1"]))
    result = run(["torch", "torchaudio", "torchvision"], real, old)
    assert not [f for f in found(result, "cuda-variant-mismatch") if f.severity == "error"]
    # without the declared pin the table still judges a pair it knows
    [f] = found(run(["a"], [dist("a", "1", {"a.py": "a"})], _torch_stack("2.14.1", torchvision=("0.28.0", []))),
                "cuda-variant-mismatch")
    assert f.severity == "warning" and "torch 2.14 pairs with torchvision 0.29.x, not 0.28.0" in f.message
    assert "'torchvision==0.29.*'" in f.hint


def test_cuda_variant_companion_an_unmet_companion_pin_is_reported_once():
    # the overlay moves torch to 2.10.0 and leaves torchaudio and torchvision, which pin torch==2.9.1
    # (the table pairs 2.10 with other releases too: requirement-unmet says it, this rule does not)
    donor = _torch_stack("2.10.0", torchaudio=("2.10.0", ["torch==2.10.0"]))
    target = _torch_stack("2.9.1", torchaudio=("2.9.1", ["torch==2.9.1"]), torchvision=("0.24.1", ["torch==2.9.1"]))
    result = run(["torch"], donor, target)
    assert not found(result, "cuda-variant-mismatch")
    unmet = {f.dists[0]: f for f in found(result, "requirement-unmet") if f.dists[0] in ("torchaudio", "torchvision")}
    assert sorted(unmet) == ["torchaudio", "torchvision"]
    assert "torchaudio 2.9.1 requires torch==2.9.1, found 2.10.0" in unmet["torchaudio"].message


def test_cuda_variant_companion_the_donors_own_pair_is_info():
    pair = _torch_stack("2.2.1+cpu", torchvision=("0.17.1", []))
    target = _torch_stack("2.1.0+cpu", torchvision=("0.16.0+cpu", []))
    [f] = found(run(["torch", "torchvision"], pair, target), "cuda-variant-mismatch")
    assert f.severity == "info" and "the donor runs with this pair too" in f.message
    assert f.hint.startswith("nothing, if the service works on the donor; otherwise install the matching build")
    # the same pair from a donor on another Python is no evidence for the target
    [f] = found(run(["torch", "torchvision"], pair, target, donor_kw={"python": "3.12.1"}), "cuda-variant-mismatch")
    assert f.severity == "error" and "the donor runs" not in f.message


def test_cuda_variant_companion_hint_overlays_the_donors_fitting_companion():
    donor = _torch_stack("2.9.1+cu128", torchvision=("0.24.1+cu128", ["torch==2.9.1"]))
    target = _torch_stack("2.9.1+cpu", torchvision=("0.24.1+cpu", ["torch==2.9.1"]))
    [f] = found(run(["torch"], donor, target), "cuda-variant-mismatch")
    assert f.severity == "error"
    assert f.hint == "add 'torchvision' to overlay (the donor's torchvision 0.24.1+cu128 pairs with torch 2.9.1+cu128)"


def test_cuda_variant_companion_hint_removes_what_the_donor_runs_without():
    donor = _torch_stack("2.9.1+cu128")
    target = _torch_stack("2.9.1+cpu", torchvision=("0.24.1+cpu", ["torch==2.9.1"]))
    [f] = found(run(["torch"], donor, target), "cuda-variant-mismatch")
    assert f.hint == ("add 'torchvision' to remove: in m.yaml (the donor runs without it), or install the matching "
                      "build: /target/venv/bin/python -m pip install torchvision==0.24.1 "
                      "--index-url https://download.pytorch.org/whl/cu128")
    assert "overlay" not in f.hint


def test_triton_is_judged_by_the_table_only_where_torch_pins_none():
    target = [dist("torch", "2.9.1+cu128", {"t.py": "t"}), dist("triton", "3.4.0", {"triton/x.py": "x"})]
    [f] = found(run(["a"], [dist("a", "1", {"a.py": "a"})], target), "cuda-variant-mismatch")
    assert "torch 2.9.1 was released with triton 3.5, not 3.4.0" in f.message and f.dists == ("torch", "triton")
    assert f.hint.endswith("install the matching release: /target/venv/bin/python -m pip install 'triton==3.5.*'")
    target[0] = dist("torch", "2.9.1+cu128", {"t.py": "t"}, requires=["triton==3.4.0"])
    assert not found(run(["a"], [dist("a", "1", {"a.py": "a"})], target), "cuda-variant-mismatch")


# --- libtorch-abi (case 8) --------------------------------------------------------------------

NEEDS = "_ZN3c106detail14torchCheckFailEPKcS2_jRKSs"


def test_case8_kernel_moves_without_its_torch():
    donor = [dist("torch", "2.6.0", {"torch/lib/libc10.so": "c10 2.6"}),
             dist("sgl-kernel", "0.1.0", {"sgl_kernel/common_ops.so": "k"})]
    target = [dist("torch", "2.7.0", {"torch/lib/libc10.so": "c10 2.7"})]
    donor_elf = elf("d", so("sgl_kernel/common_ops.so", needed=("libc10.so",), torch_undefined=(NEEDS,)))
    target_elf = elf("t", so("torch/lib/libc10.so"), defined={NEEDS: False})
    result = run(["sgl-kernel"], donor, target, donor_elf=donor_elf, target_elf=target_elf)
    [f] = found(result, "libtorch-abi")
    assert f.severity == "error" and f.dists == ("sgl-kernel", "torch")
    assert NEEDS in f.message and "moves from the donor without the donor's torch" in f.message
    assert f.hint == "add 'torch' to overlay in m.yaml (the donor has torch 2.6.0)"
    ok = elf("t", so("torch/lib/libc10.so"), defined={NEEDS: True})
    assert not found(run(["sgl-kernel"], donor, target, donor_elf=donor_elf, target_elf=ok), "libtorch-abi")


def test_kernel_left_behind_while_torch_changes():
    donor = [dist("torch", "2.7.0", {"torch/lib/libc10.so": "c10 2.7"}),
             dist("sgl-kernel", "0.2.0", {"sgl_kernel/common_ops.so": "k2"})]
    target = [dist("torch", "2.6.0", {"torch/lib/libc10.so": "c10 2.6"}),
              dist("sgl-kernel", "0.1.0", {"sgl_kernel/common_ops.so": "k"})]
    target_elf = elf("t", so("sgl_kernel/common_ops.so", needed=("libc10.so",), torch_undefined=(NEEDS,)))
    donor_elf = elf("d", so("torch/lib/libc10.so"), defined={NEEDS: False})
    [f] = found(run(["torch"], donor, target, donor_elf=donor_elf, target_elf=target_elf), "libtorch-abi")
    assert f.severity == "error" and "torch changes to torch 2.7.0" in f.message
    assert f.hint.startswith("add 'sgl-kernel' to overlay in m.yaml (the donor has sgl-kernel 0.2.0")


def test_libtorch_pairing_the_donor_runs_is_info_both_ways():
    """torch_c_dlpack_ext ships one add-on per torch release and opens only the running torch's: the
    add-ons for other releases name symbols no single torch defines. Identical on both sides, so the
    pairing after apply is the donor's own, forward and reverse."""
    ext = dist("torch-c-dlpack-ext", "0.1.5", {"torch_c_dlpack_ext/libaddon_torch29.so": "29",
                                              "torch_c_dlpack_ext/libaddon_torch214.so": "214"})
    new_torch = dist("torch", "2.14.1", {"torch/lib/libc10.so": "c10 2.14"})
    old_torch = dist("torch", "2.9.1", {"torch/lib/libc10.so": "c10 2.9"})
    facts = (so("torch_c_dlpack_ext/libaddon_torch29.so", needed=("libc10.so",), torch_undefined=(NEEDS,)),
             so("torch_c_dlpack_ext/libaddon_torch214.so", needed=("libc10.so",), torch_undefined=(NEEDS + "x",)))
    for donor_torch, target_torch, missing in ((new_torch, old_torch, NEEDS), (old_torch, new_torch, NEEDS + "x")):
        donor_elf = elf("d", so("torch/lib/libc10.so"), defined={NEEDS: missing != NEEDS, NEEDS + "x": missing == NEEDS})
        result = run(["torch"], [donor_torch, ext], [target_torch, ext], donor_elf=donor_elf, target_elf=elf("t", *facts))
        [f] = found(result, "libtorch-abi")
        assert f.severity == "info" and "the donor runs with exactly this" in f.message, f
    # the same add-on beside a torch the donor does not run: a true fault
    other = dist("torch-c-dlpack-ext", "0.1.5", {"torch_c_dlpack_ext/libaddon_torch29.so": "29 rebuilt",
                                                "torch_c_dlpack_ext/libaddon_torch214.so": "214"})
    donor_elf = elf("d", so("torch/lib/libc10.so"), defined={NEEDS: False, NEEDS + "x": True})
    [f] = found(run(["torch"], [new_torch, ext], [old_torch, other], donor_elf=donor_elf,
                    target_elf=elf("t", *facts)), "libtorch-abi")
    assert f.severity == "error" and f.files == (f"{SITE}/torch_c_dlpack_ext/libaddon_torch29.so",)


def test_renamed_kernel_package_is_an_owner_conflict_that_cannot_be_forced():
    """sgl-kernel 0.3.21 stays while sglang-kernel 0.4.10 arrives: both list sgl_kernel/*.so."""
    files = {"sgl_kernel/__init__.py": "k", "sgl_kernel/common_ops.abi3.so": "so"}
    donor = [dist("sglang-kernel", "0.4.10", files)]
    target = [dist("sgl-kernel", "0.3.21", {**files, "sgl_kernel/old_only.py": "old"})]
    result = run(["sglang-kernel"], donor, target)
    [f] = found(result, "file-owner-conflict")
    assert f.severity == "error" and f.dists == ("sgl-kernel", "sglang-kernel") and result.refused == (f,)
    assert f.files == (f"{SITE}/sgl_kernel/__init__.py", f"{SITE}/sgl_kernel/common_ops.abi3.so")
    assert f.hint.startswith("add 'sgl-kernel' to remove: in m.yaml (sglang-kernel replaces it")
    accepted = run(["sglang-kernel"], donor, target, accept=[{"code": "file-owner-conflict", "reason": "x"}])
    assert accepted.refused  # an accept: entry does not let it through
    # the fix: removing the old owner deletes only the files the new one does not bring
    fixed = run(["sglang-kernel"], donor, target, remove=["sgl-kernel"])
    assert not found(fixed, "file-owner-conflict") and not fixed.refused
    [gone] = [c for c in fixed.changes if c.name == "sgl-kernel"]
    assert f"{SITE}/sgl_kernel/old_only.py" in gone.remove and f"{SITE}/sgl_kernel/common_ops.abi3.so" not in gone.remove
    # a shared namespace __init__.py with the same bytes is no conflict
    ns = run(["nvidia-x"], [dist("nvidia-x", "13", {"nvidia/__init__.py": "", "nvidia/x/a.so": "a"})],
             [dist("nvidia-y-cu12", "12", {"nvidia/__init__.py": "", "nvidia/y/b.so": "b"})])
    assert not found(ns, "file-owner-conflict")


def test_a_pin_on_an_overlaid_distribution_is_fixed_by_the_requirer_not_by_undoing_the_overlay():
    donor = [dist("torch", "2.14.1", {"t.py": "t2"}), dist("torchaudio", "2.11.0", {"a.py": "a2"})]
    target = [dist("torch", "2.9.1", {"t.py": "t1"}), dist("torchaudio", "2.9.1", {"a.py": "a1"}, requires=["torch==2.9.1"]),
              dist("torchao", "0.9.0", {"o.py": "o"}, requires=["torch==2.9.1"])]
    unmet = found(run(["torch"], donor, target), "requirement-unmet")
    hints = {f.dists[0]: f.hint for f in unmet}
    assert hints == {"torchaudio": "add 'torchaudio' to overlay (the donor has 2.11.0, which runs with its torch)",
                     "torchao": "add 'torchao' to remove: in m.yaml (the donor runs without it; its pin would undo "
                                "the overlay's torch)"}
    assert all(f.severity == "error" for f in unmet)


# --- requirement-unmet with local labels (case 9) ---------------------------------------------

def test_case9_pin_against_a_local_label():
    sglang = dist("sglang", "0.5.5", {"sglang/__init__.py": "s"}, requires=["sgl-kernel==0.3.16.post4"])
    donor = [sglang, dist("sgl-kernel", "0.3.16.post4+cu130", {"k.py": "k"})]
    post5 = run(["sglang"], donor, [dist("sgl-kernel", "0.3.16.post5+cu130", {"k.py": "k5"})])
    [f] = found(post5, "requirement-unmet")
    assert f.severity == "error"
    assert f.message == "sglang 0.5.5 requires sgl-kernel==0.3.16.post4, found 0.3.16.post5+cu130"
    assert f.hint == "add 'sgl-kernel' to overlay (the donor has 0.3.16.post4+cu130)"
    [split] = found(post5, "lockstep-mismatch")
    assert split.hint == "add sgl-kernel to overlay in m.yaml"
    # the local label does not stop ==0.3.16.post4 from matching (PEP 440)
    post4 = run(["sglang"], donor, [dist("sgl-kernel", "0.3.16.post4+cu130", {"k.py": "k"})])
    assert not found(post4, "requirement-unmet") and not found(post4, "lockstep-mismatch")


# --- cuda-major-mismatch (case 10) ------------------------------------------------------------

def test_case10_cu128_torch_beside_cuda13_libraries():
    target = [dist("torch", "2.9.0+cu128", {"torch/__init__.py": "t"}, requires=["nvidia-cublas-cu12==12.8.4.1"])]
    donor = [dist("nvidia-cublas", "13.0.0.19", {"nvidia/cu13/lib/libcublas.so.13": "b"}),
             dist("sgl-kernel", "0.3.16.post4+cu130", {"sgl_kernel/x.so": "k"})]
    result = run(["nvidia-cublas", "sgl-kernel"], donor, target)
    [f] = found(result, "cuda-major-mismatch")
    assert f.severity == "error"
    assert "CUDA 12: torch 2.9.0+cu128 (label +cu128)" in f.message
    assert "nvidia-cublas 13.0.0.19 (version 13.0.0.19)" in f.message and "(label +cu130)" in f.message
    # the fix never asks for a build that cannot exist (a CUDA 12 build of the CUDA 13 nvidia-cublas)
    assert f.hint == ("the donor's nvidia-cublas 13.0.0.19 is itself for another CUDA major: leave 'nvidia-cublas' "
                      "out of overlay; the donor's sgl-kernel 0.3.16.post4+cu130 is itself for another CUDA major: "
                      "leave 'sgl-kernel' out of overlay, or build it for CUDA 12")
    # torch's own pin on nvidia-cublas-cu12 is unmet on both sides: reported, folded into the warning
    [unmet] = found(result, "requirement-unmet")
    assert unmet.severity == "warning" and unmet.dists == ("nvidia-cublas-cu12", "torch")
    assert "torch 2.9.0+cu128 requires nvidia-cublas-cu12==12.8.4.1, not installed" in unmet.message


def test_cuda_major_from_sonames_and_torch_version_py():
    donor = [dist("torch", "2.9.0", {"torch/version.py": "cuda = '13.0'"}),
             dist("kern", "1.0", {"kern/k.so": "k"})]
    target_elf = elf("t")
    donor_elf = elf("d", so("kern/k.so", needed=("libcudart.so.12",)))
    # the target runs another Python than the donor: another context, so the donor's own mix is no excuse
    result = run(["torch", "kern"], donor, [], donor_kw={"texts": {"torch/version.py": "cuda = '13.0'\n"}},
                 target_kw={"python": "3.12.3"}, donor_elf=donor_elf, target_elf=target_elf)
    [f] = found(result, "cuda-major-mismatch")
    assert f.severity == "error"
    assert "torch 2.9.0 (torch/version.py cuda = '13.0')" in f.message
    assert f"kern 1.0 (soname {SITE}/kern/k.so needs libcudart.so.12)" in f.message


def test_cuda_major_the_donor_runs_is_info():
    """The donor's own CUDA 12 object beside its CUDA 13 torch (nvidia-cutlass-dsl-libs-cu12 on the
    real 0.5.23 stack), moved identically to a target of the same context: info, not an error."""
    donor = [dist("torch", "2.9.0+cu130", {"torch/version.py": "cuda = '13.0'"}),
             dist("nvidia-dsl-libs-cu12", "4.3.5", {"dsl/libdsl.so": "d"}),
             dist("nvidia-cuda-runtime", "13.0.96", {"nvidia/cu13/lib/libcudart.so.13": "r"})]
    target = [dist("torch", "2.9.0+cu128", {"torch/version.py": "cuda = '12.8'"}),
              dist("nvidia-cuda-runtime-cu12", "12.8.90", {"nvidia/cuda_runtime/lib/libcudart.so.12": "r"})]
    result = run(["torch", "nvidia-*"], donor, target)
    [f] = found(result, "cuda-major-mismatch")
    # the target's leftover runtime is a true fault; the donor's own -cu12 library is named as not counted
    assert f.severity == "error" and "nvidia-cuda-runtime-cu12 12.8.90 (name -cu12)" in f.message
    assert "the donor runs with nvidia-dsl-libs-cu12 4.3.5 beside CUDA 13 too" in f.message
    assert f.hint == ("add to remove: in m.yaml: [nvidia-cuda-runtime-cu12] (a CUDA 13 environment does not "
                      "load it, and the donor runs without it)")
    result = run(["torch", "nvidia-*"], donor, target, remove=["nvidia-*-cu12"])
    [f] = found(result, "cuda-major-mismatch")
    assert f.severity == "info" and f.dists == ("nvidia-dsl-libs-cu12",) and not result.blocking


def test_one_cuda_major_is_quiet():
    donor = [dist("torch", "2.9.0+cu130", {"t.py": "t"}), dist("nvidia-cuda-runtime", "13.0.96", {"r.so": "r"})]
    assert not found(run(["torch", "nvidia-cuda-runtime"], donor, []), "cuda-major-mismatch")


# --- driver-too-old (case 11) -----------------------------------------------------------------

def test_case11_driver_535_with_a_cu130_environment():
    nv = {"available": True, "driver_version": "535.104.05", "cuda_version": "12.2", "gpus": []}
    result = run(["torch"], [dist("torch", "2.9.0+cu130", {"t.py": "t"})], [], target_kw={"nvidia": nv})
    [f] = found(result, "driver-too-old")
    assert f.severity == "error" and "driver 535.104.05 supports CUDA 12.2" in f.message
    assert f.hint.startswith("upgrade the target's NVIDIA driver to 580.65.06 or newer (CUDA 13.0")


def test_driver_below_the_minor_is_a_warning_and_a_new_driver_is_quiet():
    nv = {"available": True, "driver_version": "550.54.14", "cuda_version": "12.4", "gpus": []}
    result = run(["torch"], [dist("torch", "2.7.0+cu128", {"t.py": "t"})], [], target_kw={"nvidia": nv})
    assert [f.severity for f in found(result, "driver-too-old")] == ["warning"]
    assert not found(run(["torch"], [dist("torch", "2.9.0+cu130", {"t.py": "t"})], [], target_kw={"nvidia": NV_H100}),
                     "driver-too-old")


# --- gpu-arch-unsupported ---------------------------------------------------------------------

def test_device_code_rules():
    sm90a = (DeviceCode(kind="sass", arch=90, variant="a"),)
    assert covers(sm90a, 90) and not covers(sm90a, 100)
    assert covers((DeviceCode(kind="sass", arch=80),), 86) and not covers((DeviceCode(kind="sass", arch=80),), 90)
    assert covers((DeviceCode(kind="ptx", arch=80),), 120)
    assert covers((DeviceCode(kind="sass", arch=100, variant="f"),), 103)


def test_kernels_without_code_for_the_target_gpu():
    kernel = dist("sgl-kernel", "0.3.16+cu130", {"sgl_kernel/common_ops.so": "k"})
    code = (DeviceCode(kind="sass", arch=100, variant="a"), DeviceCode(kind="sass", arch=120, variant="a"))
    donor_elf = elf("d", so("sgl_kernel/common_ops.so", device_code=code))
    result = run(["sgl-kernel"], [kernel], [], target_kw={"nvidia": NV_H100}, donor_elf=donor_elf, target_elf=elf("t"))
    [f] = found(result, "gpu-arch-unsupported")
    assert f.severity == "error" and "sm_100a, sm_120a" in f.message and "(sm_90)" in f.message
    assert 'TORCH_CUDA_ARCH_LIST="9.0"' in f.hint
    good = elf("d", so("sgl_kernel/common_ops.so", device_code=code + (DeviceCode(kind="sass", arch=90, variant="a"),)))
    assert not found(run(["sgl-kernel"], [kernel], [], target_kw={"nvidia": NV_H100}, donor_elf=good,
                         target_elf=elf("t")), "gpu-arch-unsupported")


def test_cuda_release_too_old_for_a_blackwell_gpu():
    nv = {**NV_H100, "gpus": [{"name": "NVIDIA RTX PRO 6000", "compute_capability": "12.0", "memory_mib": 97887}]}
    result = run(["torch"], [dist("torch", "2.6.0+cu126", {"t.py": "t"})], [], target_kw={"nvidia": nv})
    [f] = found(result, "gpu-arch-unsupported")
    assert "needs CUDA 12.8 or newer" in f.message and f.severity == "error"
    assert f.hint == "overlay builds for CUDA 12.8 or newer (e.g. torch +cu128)"
    assert not found(run(["torch"], [dist("torch", "2.7.0+cu128", {"t.py": "t"})], [], target_kw={"nvidia": nv}),
                     "gpu-arch-unsupported")


# --- lockstep-mismatch ------------------------------------------------------------------------

def test_flashinfer_family_split_by_the_overlay():
    donor = [dist("flashinfer-python", "0.7.2", {"flashinfer/__init__.py": "f"}),
             dist("flashinfer-jit-cache", "0.7.2+cu130", {"flashinfer_jit_cache/__init__.py": "j"}),
             dist("torch", "2.9.0+cu130", {"t.py": "t"})]
    target = [dist("flashinfer-python", "0.6.3", {"flashinfer/__init__.py": "f0"}),
              dist("torch", "2.9.0+cu130", {"t.py": "t"})]
    [f] = found(run(["flashinfer-jit-cache"], donor, target), "lockstep-mismatch")
    assert f.severity == "error" and "not one release" in f.message
    assert f.hint == "add flashinfer-python to overlay in m.yaml"
    assert not found(run(["flashinfer-*"], donor, target), "lockstep-mismatch")


def test_jit_cache_label_must_follow_torch_and_can_be_accepted():
    donor = [dist("flashinfer-python", "0.7.2", {"f.py": "f"}), dist("flashinfer-jit-cache", "0.7.2+cu130", {"j.py": "j"})]
    target = [dist("torch", "2.13.0+cpu", {"t.py": "t"})]
    result = run(["flashinfer-*"], donor, target)
    [f] = found(result, "lockstep-mismatch")
    assert f.dists == ("flashinfer-jit-cache", "torch") and f.severity == "error" and result.blocking
    accepted = run(["flashinfer-*"], donor, target, accept=[
        {"code": "lockstep-mismatch", "dists": ["flashinfer-jit-cache", "torch"], "reason": "CPU demo"}])
    [f] = found(accepted, "lockstep-mismatch")
    assert f.accepted == "CPU demo" and not accepted.blocking
    # an acceptance for one distribution does not cover a finding that names others too
    narrow = run(["flashinfer-*"], donor, target, accept=[
        {"code": "lockstep-mismatch", "dists": ["flashinfer-jit-cache"], "reason": "no"}])
    assert narrow.blocking


def test_remove_and_accept_entries_that_do_nothing_are_reported():
    result = run(["a"], [dist("a", "1", {"a.py": "a"})], [dist("old-cu12", "1", {"o.py": "o"}),
                                                         dist("nvidia-nccl-cu12", "2", {"n.py": "n"})],
                 remove=["old-cu12", "nvidia-nccl-cu21", "sgl-kernel"],
                 accept=[{"code": "libtorch-abi", "reason": "stale"}])
    typo, gone = found(result, "remove-no-match")
    assert typo.severity == "warning" and "'nvidia-nccl-cu21' matches no distribution" in typo.message
    assert "did you mean nvidia-nccl-cu12?" in typo.message and typo.dists == ("nvidia-nccl-cu12",)
    # a name close to nothing on the target is already absent (an earlier apply removed it): no typo to fix
    assert gone.severity == "info" and "'sgl-kernel' matches no distribution on the target: it is already absent" \
        in gone.message and gone.hint.startswith("nothing to do")
    assert [c.action for c in result.changes if c.name == "old-cu12"] == ["remove"]
    [unused] = found(result, "accept-unused")
    assert unused.severity == "info" and unused.hint == "remove accept[0] from m.yaml if the fault is gone"


def test_a_glob_remove_matching_only_what_the_overlay_brings_is_info():
    donor = [dist("nvidia-dsl-libs-cu12", "4.8", {"d.py": "d"})]
    result = run(["nvidia-*"], donor, [], remove=["nvidia-*-cu12"])
    [f] = found(result, "remove-no-match")
    assert f.severity == "info" and f.hint == "nothing to do" and f.dists == ("nvidia-dsl-libs-cu12",)


def test_recompiled_bytecode_is_not_drift_but_an_edited_source_is():
    """A .pyc differing from RECORD beside an intact source is a recompile (the header holds the
    source's mtime): numpy's conv_template pyc on the real 0.5.23 stack. An edited .py is drift."""
    files = {"m/t.py": "src", "m/__pycache__/t.cpython-311.pyc": "pyc"}
    recompiled = dist("m", "1", files, on_disk={"m/__pycache__/t.cpython-311.pyc": "pyc again"})
    assert not found(run(["m"], [recompiled], []), "record-drift")
    edited = dist("m", "1", files, on_disk={"m/t.py": "edited", "m/__pycache__/t.cpython-311.pyc": "pyc again"})
    [f] = found(run(["m"], [edited], []), "record-drift")
    assert f.files == (f"{SITE}/m/__pycache__/t.cpython-311.pyc", f"{SITE}/m/t.py")


def test_a_target_file_with_the_donors_drifted_bytes_is_not_the_targets_edit():
    """After an apply of a donor's hand-edited file, the target holds the donor's bytes: the
    donor's drift is reported (on the donor's side), not a target edit that "apply replaces"
    (apply copies nothing there). The twin: a target file edited otherwise is still reported."""
    files = {"m/t.py": "src", "m/u.py": "u"}
    donor = dist("m", "1", files, on_disk={"m/t.py": "edited"})
    same = dist("m", "1", files, on_disk={"m/t.py": "edited"})
    found_same = found(run(["m"], [donor], [same]), "record-drift")
    assert [f.message.split(":")[0] for f in found_same] == ["m 1 on the donor"], found_same
    other = dist("m", "1", files, on_disk={"m/t.py": "edited", "m/u.py": "local"})
    [on_donor, on_target] = found(run(["m"], [donor], [other]), "record-drift")
    assert on_target.message.startswith("m 1 on the target") and on_target.files == (f"{SITE}/m/u.py",)


def test_manifest_template_placeholder_is_named():
    from transplant.errors import ManifestError

    with pytest.raises(ManifestError) as caught:
        parse_manifest({"version": 1, "donor": {"host": "@DONOR@", "venv": "/v"},
                        "target": {"host": "local", "venv": "/w"}, "overlay": ["a"]}, path="t.yaml")
    assert "donor.host: '@DONOR@' is a template placeholder" in str(caught.value)


def test_acceptance_with_dists_does_not_cover_a_finding_without_any():
    result = run(["a"], [dist("a", "1", {"a.py": "a"})], [], target_kw={"home_exists": False},
                 accept=[{"code": "interpreter-missing", "dists": ["unrelated"], "reason": "no"}])
    assert [f.accepted for f in found(result, "interpreter-missing")] == [None] and result.blocking


def test_records_that_name_the_venv_itself_are_never_removed_or_written():
    evil = dist("evil", "1", {"evil/__init__.py": "e"})
    for row in ("../../../pyvenv.cfg", "../../../bin/python3.11", "../../../bin/activate"):
        evil["record"].append({"path": row, "venv_path": row.replace("../../../", ""), "record_hash": None,
                               "record_size": None, "exists": True, "mode": 0o644, "size": 10})
    result = run(["a"], [dist("a", "1", {"a.py": "a"})], [evil], remove=["evil"])
    [change] = [c for c in result.changes if c.name == "evil"]
    assert not any(p in change.remove for p in ("pyvenv.cfg", "bin/python3.11", "bin/activate"))
    [f] = found(result, "unsafe-path")
    assert f.severity == "error" and f.files == ("bin/activate", "bin/python3.11", "pyvenv.cfg")
    donor_evil = dist("evil", "2", {"evil/__init__.py": "e2"})
    donor_evil["record"].append({"path": "../../../pyvenv.cfg", "venv_path": "pyvenv.cfg", "record_hash": None,
                                 "record_size": None, "exists": True, "mode": 0o644, "size": 10, "hash": digest("x")})
    moved = run(["evil"], [donor_evil], [])
    assert "pyvenv.cfg" not in [c.path for c in moved.changes[0].copy]
    assert [f.severity for f in found(moved, "unsafe-path")] == ["error"]


def test_unreadable_binaries_are_said_not_passed():
    wheel = dist("a", "1", {"a/x.so": "so", "a/y.so": "so"})
    donor_elf = elf("d", ElfFacts(path=f"{SITE}/a/x.so", error="not an ELF file (starts with b'hello')"),
                    so("a/y.so", notes=("its compressed .nv_fatbin section would inflate to 4294967296 bytes; not read",)))
    [f] = found(run(["a"], [wheel], [], donor_elf=donor_elf, target_elf=elf("t")), "binary-unreadable")
    assert f.severity == "warning" and f.files == (f"{SITE}/a/x.so", f"{SITE}/a/y.so")
    assert not found(run(["a"], [wheel], [], donor_elf=elf("d", so("a/x.so"), so("a/y.so")), target_elf=elf("t")),
                     "binary-unreadable")


SH_EXEC = "'" * 3 + "exec'"
SH_CLOSE = "' " + "'" * 3  # pip's form has three lines; the third closes line 2's string for Python


@pytest.mark.parametrize("head, target, want", [
    ("#!/donor/venv/bin/python\n", "/t x", f"#!/bin/sh\n{SH_EXEC} '/t x/bin/python' \"$0\" \"$@\"\n{SH_CLOSE}\n"),
    ("#!/usr/bin/env /donor/venv/bin/python3\n", "/t", "#!/t/bin/python3\n"),
    ("#!/donor/venv/bin/python\r\n", "/t", "#!/t/bin/python\r\n"),
    (f"#!/bin/sh\n{SH_EXEC} \"/donor/venv/bin/python \"$0\" \"$@\"\n", "/t", None),  # unbalanced quote: left alone
    (f"#!/bin/sh\n{SH_EXEC} '/donor/venv/bin/python' \"$0\" \"$@\"\n", "/t",
     f"#!/bin/sh\n{SH_EXEC} /t/bin/python \"$0\" \"$@\"\n{SH_CLOSE}\n"),
])


def test_shebang_rewrites(head, target, want):
    from transplant.core.rules.venvfiles import rewritten_head

    assert rewritten_head(head, DONOR, target) == want


# --- host-library-missing -----------------------------------------------------------------------

def _hostlib_run(target_sonames, donor_sonames, files=None):
    import dataclasses

    wheel = dist("a", "1", files or {"a/x.so": "so"})
    donor = inv([wheel], DONOR)
    target = inv([], TARGET)
    donor = dataclasses.replace(donor, system_sonames=donor_sonames)
    target = dataclasses.replace(target, system_sonames=target_sonames)
    donor_elf = elf("d", so("a/x.so", needed=("libc.so.6", "libcbor.so.0.10", "libcuda.so.1")))
    return found(plan(manifest(["a"]), donor, target, (), donor_elf=donor_elf, target_elf=elf("t")),
                 "host-library-missing")


def test_host_library_the_target_lacks_is_an_error_and_the_driver_is_left_out():
    [f] = _hostlib_run(frozenset({"libc.so.6"}), frozenset({"libc.so.6", "libcbor.so.0.10"}))
    assert f.severity == "error" and "libcbor.so.0.10" in f.message and "libcuda" not in f.message
    assert f.hint.startswith("install the package that provides libcbor.so.0.10 on the target")


def test_host_library_nothing_when_provided_by_the_target_the_venv_or_not_read():
    assert not _hostlib_run(frozenset({"libc.so.6", "libcbor.so.0.10"}), frozenset({"libc.so.6"}))
    assert not _hostlib_run(None, frozenset({"libc.so.6", "libcbor.so.0.10"}))
    # a file of that name inside the venv after apply provides it, wherever it lies
    assert not _hostlib_run(frozenset({"libc.so.6"}), frozenset({"libc.so.6"}),
                            files={"a/x.so": "so", "a.libs/libcbor.so.0.10": "lib"})
    [f] = _hostlib_run(frozenset({"libc.so.6"}), frozenset({"libc.so.6"}))
    assert f.severity == "info" and "lacks it too" in f.message


# --- runpath-outside-venv ------------------------------------------------------------------------

def _runpath_run(runpath, *, donor_seen=None, target_seen=None, target_sonames=frozenset({"libc.so.6"}),
                 files=None, rpath=()):
    import dataclasses

    donor = dataclasses.replace(inv([dist("a", "1", files or {"a/x.so": "so"})], DONOR),
                                system_sonames=frozenset({"libc.so.6"}), elsewhere=donor_seen or {})
    target = dataclasses.replace(inv([], TARGET), system_sonames=target_sonames, elsewhere=target_seen or {})
    donor_elf = elf("d", so("a/x.so", needed=("libc.so.6", "libcbor.so.0.10"), runpath=runpath, rpath=rpath))
    result = plan(manifest(["a"]), donor, target, (), donor_elf=donor_elf, target_elf=elf("t"))
    return found(result, "runpath-outside-venv"), found(result, "host-library-missing")


def test_runpath_origin_entry_resolving_inside_the_venv_is_silent():
    # $ORIGIN/../a.libs holds the library inside the venv after apply: nothing to say, and no
    # host path is asked about
    from transplant.core.rules.hostlibs import runpath_queries

    facts = so("a/x.so", needed=("libcbor.so.0.10",), runpath=("$ORIGIN/../a.libs", "${ORIGIN}"))
    assert runpath_queries([facts]) == []
    assert _runpath_run(("$ORIGIN/../a.libs",), files={"a/x.so": "so", "a.libs/libcbor.so.0.10": "lib"}) == ([], [])
    # without the library in the venv, the $ORIGIN entry changes nothing: host-library-missing's case
    mine, hostlib = _runpath_run(("$ORIGIN/../a.libs",))
    assert mine == [] and [f.severity for f in hostlib] == ["info"]


def test_runpath_queries_ask_each_absolute_folder_and_its_libraries():
    from transplant.core.rules.hostlibs import runpath_queries

    facts = so("a/x.so", needed=("libc.so.6", "libcuda.so.1", "libcbor.so.0.10"), rpath=("/opt/v/lib/", "rel"))
    assert runpath_queries([facts]) == ["/opt/v/lib", "/opt/v/lib/libc.so.6", "/opt/v/lib/libcbor.so.0.10"]
    # DT_RPATH is ignored when DT_RUNPATH is present (ld.so(8))
    assert runpath_queries([so("a/x.so", needed=("libm.so.6",), runpath=("/r",), rpath=("/p",))]) == [
        "/r", "/r/libm.so.6"]


def test_runpath_library_only_in_a_donor_folder_the_target_lacks_is_an_error():
    lib = "/opt/vendor/lib/libcbor.so.0.10"
    donor_seen = {"/opt/vendor/lib": True, lib: True, "/opt/vendor/lib/libc.so.6": False}
    absent = {"/opt/vendor/lib": False, lib: False, "/opt/vendor/lib/libc.so.6": False}
    [f], hostlib = _runpath_run(("/opt/vendor/lib",), donor_seen=donor_seen, target_seen=absent)
    assert hostlib == []  # the donor finds it: judged here, not as host-library-missing
    assert f.severity == "error" and "libcbor.so.0.10 from /opt/vendor/lib" in f.message
    assert f.hint.startswith(f"install libcbor.so.0.10 on the target at {lib} as on the donor")
    assert "$ORIGIN" in f.hint
    # the same through DT_RPATH
    [f], _ = _runpath_run((), rpath=("/opt/vendor/lib",), donor_seen=donor_seen, target_seen=absent)
    assert f.severity == "error"
    # the target has it there, or its loader finds it elsewhere, or the venv carries it: silent
    assert _runpath_run(("/opt/vendor/lib",), donor_seen=donor_seen, target_seen={**absent, lib: True}) == ([], [])
    assert _runpath_run(("/opt/vendor/lib",), donor_seen=donor_seen, target_seen=absent,
                        target_sonames=frozenset({"libc.so.6", "libcbor.so.0.10"})) == ([], [])
    assert _runpath_run(("/opt/vendor/lib",), donor_seen=donor_seen, target_seen=absent,
                        files={"a/x.so": "so", "a.libs/libcbor.so.0.10": "lib"}) == ([], [])
    # the target was not asked (an older probe): not judged
    assert _runpath_run(("/opt/vendor/lib",), donor_seen=donor_seen)[0] == []
    # the target's library names not read: not judged
    assert _runpath_run(("/opt/vendor/lib",), donor_seen=donor_seen, target_seen=absent, target_sonames=None) == (
        [], [])


def test_runpath_folder_the_donor_loads_nothing_from_is_info():
    folder = "/home/builder/src/build/lib"
    none_there = {folder: False, f"{folder}/libcbor.so.0.10": False, f"{folder}/libc.so.6": False}
    [f], [h] = _runpath_run((folder,), donor_seen=none_there, target_seen=none_there)
    assert f.severity == "info" and folder in f.message and "the donor's host has no such folder either" in f.message
    assert h.severity == "info"  # the library itself: host-library-missing's (the donor lacks it too)
    # the donor's own venv is not outside it; an unasked donor (a snapshot) is not judged
    assert _runpath_run((f"{DONOR}/lib",), donor_seen={f"{DONOR}/lib": False})[0] == []
    assert _runpath_run((folder,), target_seen=none_there)[0] == []


# --- cpu-isa-unsupported ------------------------------------------------------------------------

def _cpu_run(flags, needed):
    import dataclasses

    donor = inv([dist("a", "1", {"a/x.so": "so"})], DONOR)
    target = dataclasses.replace(inv([], TARGET), cpu_flags=flags)
    donor_elf = elf("d", so("a/x.so", x86_isa_needed=needed))
    return found(plan(manifest(["a"]), donor, target, (), donor_elf=donor_elf, target_elf=elf("t")),
                 "cpu-isa-unsupported")


def test_cpu_level_the_target_lacks_is_an_error_naming_the_missing_flags():
    from transplant.core.data import x86_levels
    from transplant.core.rules.cpu import missing_flags

    table = x86_levels()["levels"]
    v3 = frozenset(f for level in ("x86-64-baseline", "x86-64-v2", "x86-64-v3") for f in table[level])
    assert missing_flags("x86-64-v3", v3) == []
    [f] = _cpu_run(v3, ("x86-64-baseline", "x86-64-v2", "x86-64-v3", "x86-64-v4"))
    assert f.severity == "error" and "needs x86-64-v4 (the CPU lacks avx512f, avx512bw" in f.message
    assert not _cpu_run(v3, ("x86-64-baseline", "x86-64-v2", "x86-64-v3"))


def test_cpu_level_not_judged_without_the_note_or_the_flags():
    assert not _cpu_run(frozenset({"sse2"}), ())  # no GNU property note: the object says nothing
    assert not _cpu_run(frozenset({"sse2"}), None)  # not read
    assert not _cpu_run(None, ("x86-64-v4",))  # the target's flags not read


# --- driver-unusable ----------------------------------------------------------------------------

def test_driver_unusable_shows_the_hosts_text_with_control_characters_made_visible():
    import dataclasses

    from transplant.core.inventory import NvidiaFacts

    donor = inv([dist("nvidia-cuda-runtime", "13.0.96", {"nvidia/cu13/lib/libcudart.so.13": "r"})], DONOR)
    target = inv([], TARGET)
    broken = NvidiaFacts(available=False, reason="nvidia-smi exited 18", kernel_module="570.1",
                         failure="Failed to initialize NVML: Driver/library version mismatch\x1b[2J" + "x" * 400)
    result = plan(manifest(["nvidia-cuda-runtime"]), donor, dataclasses.replace(target, nvidia=broken), ())
    [f] = found(result, "driver-unusable")
    assert f.severity == "error" and "\x1b" not in f.message and "\\x1b[2J" in f.message
    assert "kernel module is 570.1" in f.message and len(f.message) < 700
    assert not found(plan(manifest(["nvidia-cuda-runtime"]), donor, target, ()), "driver-unusable")


# --- c-toolchain-missing ------------------------------------------------------------------------

def _toolchain(compiler="gcc", python_h=True, include="/usr/include/python3.11", os_id="debian"):
    from transplant.core.inventory import CompilerFacts, CToolchainFacts, OsRelease

    cc = None if compiler is None else CompilerFacts(
        source="CC" if compiler.startswith("$") else compiler, command=compiler.lstrip("$"),
        path=None if compiler.startswith("$") else f"/usr/bin/{compiler}", version=f"{compiler} 12.2.0")
    return CToolchainFacts(compiler=cc, include=include, python_h=python_h,
                           os=OsRelease(id=os_id, id_like=None, version_id="12") if os_id else None)


def _ctool_run(target, donor, *, target_triton=None, donor_triton="3.5.1"):
    import dataclasses

    d = dataclasses.replace(inv([dist("triton", donor_triton, {"triton/__init__.py": "t"})], DONOR), c_toolchain=donor)
    t = dataclasses.replace(inv([dist("triton", target_triton, {"triton/__init__.py": "t"})] if target_triton else [],
                                TARGET), c_toolchain=target)
    return found(plan(manifest(["triton"]), d, t, ()), "c-toolchain-missing")


def test_c_toolchain_the_target_lacks_and_the_donor_has_blocks_with_the_debian_packages():
    [f] = _ctool_run(_toolchain(compiler=None, python_h=False), _toolchain())
    assert f.severity == "error" and f.dists == ("triton",)
    assert "no C compiler (CC is unset and neither gcc nor clang is on PATH)" in f.message
    assert "no Python.h in /usr/include/python3.11" in f.message and "builds it with /usr/bin/gcc" in f.message
    assert f.hint.startswith("on the target, as root: apt-get install -y gcc python3.11-dev")
    assert f.files == ("/usr/include/python3.11",)


def test_c_toolchain_severity_follows_the_package_and_the_donor():
    # triton already on the target at the same version: apply changes nothing about it
    [f] = _ctool_run(_toolchain(compiler=None), _toolchain(), target_triton="3.5.1")
    assert f.severity == "warning" and f.hint == ("on the target, as root: apt-get install -y gcc (the probe ran in "
                                                   "an SSH session's environment: a service that sets CC or PATH may "
                                                   "find another compiler; verify.env can give verify the service's)")
    # the donor cannot build the launcher either: it never launched a kernel, so info
    [f] = _ctool_run(_toolchain(compiler=None), _toolchain(compiler=None))
    assert f.severity == "info" and "has no C compiler" in f.message and "either" in f.message


def test_c_toolchain_hints_for_another_python_build_a_bad_cc_and_another_system():
    # Python.h missing from a Python build of its own (not the system's): the headers come with that build
    [f] = _ctool_run(_toolchain(python_h=False, include="/opt/py/include/python3.11"), _toolchain())
    assert "Python.h comes with the Python build the venv runs (/usr/bin)" in f.hint and "apt-get" not in f.hint
    [f] = _ctool_run(_toolchain(compiler="$ccache gcc"), _toolchain())
    assert "CC='ccache gcc' names nothing on PATH" in f.message and "or set CC to a compiler that exists" in f.hint
    [f] = _ctool_run(_toolchain(compiler=None, os_id="fedora"), _toolchain())
    assert f.hint.startswith("on the target, install a C compiler (gcc or clang) with the distribution's")


def test_c_toolchain_nothing_when_it_builds_without_triton_or_unread():
    assert not _ctool_run(_toolchain(), _toolchain(compiler=None))
    assert not _ctool_run(None, _toolchain())
    import dataclasses

    d = dataclasses.replace(inv([dist("a", "1", {"a.py": "x"})], DONOR), c_toolchain=_toolchain())
    t = dataclasses.replace(inv([], TARGET), c_toolchain=_toolchain(compiler=None))
    assert not found(plan(manifest(["a"]), d, t, ()), "c-toolchain-missing")


# --- libcuda-compat-mismatch --------------------------------------------------------------------

def _compat_run(gpu: str, *, version="570.124.06", module="535.104.05", path="/usr/local/cuda-12.8/compat/libcuda.so.1",
                how="ld.so.cache", cuda=True):
    import dataclasses

    from transplant.core.inventory import Gpu, LoadedLibcuda

    overlay = ["nvidia-cuda-runtime"] if cuda else ["a"]
    donor = inv([dist("nvidia-cuda-runtime", "12.8.90", {"nvidia/cuda_runtime/lib/libcudart.so.12": "r"})] if cuda
                else [dist("a", "1", {"a.py": "x"})], DONOR)
    target = inv([], TARGET, nvidia=NV_H100)
    nvidia = dataclasses.replace(target.nvidia, driver_version=module, cuda_version="12.2", kernel_module=module,
                                 gpus=(Gpu(name=gpu, compute_capability="8.9", memory_mib=24564),))
    loaded = LoadedLibcuda(path=path, real=posixpath.join(posixpath.dirname(path), f"libcuda.so.{version}"),
                           version=version, how=how)
    return plan(manifest(overlay), donor, dataclasses.replace(target, nvidia=nvidia, libcuda_loaded=loaded), ())


def test_a_compat_libcuda_on_a_geforce_is_an_error_naming_the_library_and_the_module():
    [f] = found(_compat_run("NVIDIA GeForce RTX 4090"), "libcuda-compat-mismatch")
    assert f.severity == "error" and f.dists == ("nvidia-cuda-runtime",)
    assert ("forward-compatibility library 570.124.06 from /usr/local/cuda-12.8/compat/libcuda.so.1 "
            "(-> libcuda.so.570.124.06), found through ld.so.cache, and the kernel module is 535.104.05") in f.message
    assert "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE (804" in f.message and "NVIDIA GeForce RTX 4090" in f.message
    assert f.hint.startswith("on the target: remove the ld.so.conf.d entry naming /usr/local/cuda-12.8/compat")
    assert f.files == ("/usr/local/cuda-12.8/compat/libcuda.so.1",)


def test_a_compat_libcuda_on_a_data_center_gpu_is_a_warning_naming_what_to_verify():
    [f] = found(_compat_run("NVIDIA H100 80GB HBM3", how="LD_LIBRARY_PATH"), "libcuda-compat-mismatch")
    assert f.severity == "warning" and "verify that the target's GPUs (NVIDIA H100 80GB HBM3)" in f.message
    assert "kernel driver branch 535 is one the compat package 570.124.06 supports" in f.message
    assert "take /usr/local/cuda-12.8/compat out of LD_LIBRARY_PATH" in f.hint


def test_the_drivers_own_libcuda_and_a_venv_without_cuda_find_nothing():
    assert not found(_compat_run("NVIDIA GeForce RTX 4090", version="535.104.05"), "libcuda-compat-mismatch")
    assert not found(_compat_run("NVIDIA GeForce RTX 4090", cuda=False), "libcuda-compat-mismatch")
    assert not found(run(["a"], [dist("a", "1", {"a.py": "x"})], [], target_kw={"nvidia": NV_H100}),
                     "libcuda-compat-mismatch")


def test_a_compat_library_inside_the_venv_is_named_so():
    [f] = found(_compat_run("GeForce GTX 1080", path=f"{TARGET}/lib/python3.11/site-packages/x/libcuda.so.1",
                            how="LD_LIBRARY_PATH"), "libcuda-compat-mismatch")
    assert f.severity == "error" and "found through LD_LIBRARY_PATH, inside the venv" in f.message


def test_excluded_gpus_match_the_word_only():
    from transplant.core.rules.cudacompat import excluded_gpus

    assert excluded_gpus(["NVIDIA GeForce RTX 4090", "NVIDIA H100 80GB HBM3", "NVIDIA RTX A6000"]) == [
        "NVIDIA GeForce RTX 4090"]
