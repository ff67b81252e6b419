"""The host fact table: each fact the controller reads is one row (the Inventory field it fills,
the probe's host-script part that reports it, its parser), and both sides agree."""

from __future__ import annotations

import dataclasses

import pytest

from transplant.core.inventory import HOST_FACTS, HostFact, Inventory, parse_inventory
from transplant.remote import probe

#: Parts the probe reports that the controller does not read (the document and its fingerprint keep them).
REPORTED_ONLY = {"machine"}


def table_problems(facts: tuple[HostFact, ...], parts: dict[str, object]) -> list[str]:
    """Where the fact table and the probe's parts disagree: a row whose part the probe lacks or
    whose field the inventory lacks, a part no row reads (unless listed as reported only), a
    field or part named twice. Empty: they agree."""
    fields = {f.name for f in dataclasses.fields(Inventory)}
    problems = [f"{f.name}: the probe has no part {f.part!r}" for f in facts if f.part not in parts]
    problems += [f"{f.name}: not a field of Inventory" for f in facts if f.name not in fields]
    problems += [f"the probe's part {p!r} has no row" for p in parts if p not in {f.part for f in facts}
                 and p not in REPORTED_ONLY]
    for what in ("name", "part"):
        names = [getattr(f, what) for f in facts]
        problems += [f"{n}: named by two rows" for n in sorted({n for n in names if names.count(n) > 1})]
    return problems


def test_the_table_and_the_probe_agree() -> None:
    assert table_problems(HOST_FACTS, probe.HOST_PARTS) == []
    assert {f.cache_key for f in HOST_FACTS} == {"host.hostname", "host.nvidia", "host.libcuda", "host.sonames",
                                                 "host.cpu", "host.jit_compilers", "host.c_toolchain",
                                                 "host.libcuda_loaded"}


def test_a_row_without_its_part_or_field_and_a_part_without_a_row_are_named() -> None:
    """The positive twin: the check fires on a toy table."""
    toy = HOST_FACTS + (HostFact("uptime", "uptime", int, lambda value, path: value),)
    parts = {**probe.HOST_PARTS, "kernel": lambda shared: "6.1"}
    assert table_problems(toy, parts) == ["uptime: the probe has no part 'uptime'", "uptime: not a field of Inventory",
                                          "the probe's part 'kernel' has no row"]


def _document() -> dict:
    host = probe._host_facts()
    return {"schema": "transplant.inventory/1", "host": host,
            "interpreter": {"executable": "/v/bin/python", "prefix": "/v", "version": "3.11.2",
                            "implementation": "cpython", "abi_tag": None, "soabi": None, "ext_suffix": None,
                            "machine": "x86_64", "glibc": None, "pyvenv_cfg": None, "home_exists": None,
                            "markers": {}},
            "paths": {"prefix": "/v", "purelib": "lib/python3.11/site-packages",
                      "platlib": "lib/python3.11/site-packages", "scripts": "bin"},
            "distributions": []}


def test_each_row_fills_its_field_from_the_probes_part() -> None:
    document = _document()
    inventory = parse_inventory(document, label="here")
    assert inventory.hostname == document["host"]["hostname"]
    for fact in HOST_FACTS:
        assert getattr(inventory, fact.name) == fact.parse(document["host"].get(fact.part), fact.cache_key)


@pytest.mark.parametrize("fact", [f for f in HOST_FACTS if f.wire is dict], ids=lambda f: f.name)


def test_a_malformed_fact_is_named_by_its_key_path(fact: HostFact) -> None:
    from transplant.errors import ProbeError

    document = _document()
    document["host"][fact.part] = ["not", "an", "object"]
    with pytest.raises(ProbeError, match=f"inventory key '{fact.cache_key}'"):
        parse_inventory(document, label="here")


def test_a_compiler_release_that_is_not_major_minor_is_refused() -> None:
    from transplant.errors import ProbeError

    document = _document()
    document["host"]["jit_compilers"] = {"nvcc": {"path": "/usr/local/cuda/bin/nvcc", "source": "default",
                                                  "release": "12.8; rm -rf /", "build": None, "error": None}}
    with pytest.raises(ProbeError, match="host.jit_compilers.nvcc.release"):
        parse_inventory(document, label="here")
    document["host"]["jit_compilers"]["nvcc"]["release"] = "12.8"
    nvcc = parse_inventory(document, label="here").jit_compilers.nvcc
    assert nvcc is not None and nvcc.release == (12, 8) and nvcc.describe() == "/usr/local/cuda/bin/nvcc (CUDA 12.8)"


def test_a_compiler_path_or_source_out_of_bounds_is_refused_by_its_key_path() -> None:
    """The compiler's path is shown in jit-compiler-too-old's message: a path with a control
    character (an escape sequence) is refused, as libcuda_loaded's is; ``source`` is one of the
    names the probe writes."""
    from transplant.errors import ProbeError

    good = {"path": "/usr/local/cuda/bin/nvcc", "source": "CUDA_HOME", "release": "12.8", "build": "12.8.93",
            "error": None}
    for key, value in (("path", "/opt/\x1b]0;owned\x07/nvcc"), ("path", "/opt/cuda\n/bin/nvcc"),
                       ("source", "\x1b[2J"), ("source", "somewhere")):
        document = _document()
        document["host"]["jit_compilers"] = {"nvcc": {**good, key: value}}
        with pytest.raises(ProbeError, match=f"host.jit_compilers.nvcc.{key}"):
            parse_inventory(document, label="here")
    for source in ("triton", "TRITON_PTXAS_PATH", "CUDA_HOME", "CUDA_PATH", "PATH", "default", "wheel"):
        document = _document()
        document["host"]["jit_compilers"] = {"nvcc": {**good, "source": source}}
        assert parse_inventory(document, label="here").jit_compilers.nvcc.source == source


def test_the_c_toolchain_is_triton_s_compiler_and_this_interpreter_s_python_h(monkeypatch, tmp_path) -> None:
    """``_c_toolchain`` follows triton's order (``CC``, then gcc, then clang on PATH) and looks for
    Python.h in the interpreter's include folder; a ``CC`` naming nothing has no path."""
    import os
    import shutil
    import sysconfig

    here = probe._c_toolchain()
    include = sysconfig.get_paths()["include"]
    assert here["include"] == include and here["python_h"] == os.path.isfile(f"{include}/Python.h")
    gcc = shutil.which("gcc")
    if gcc is not None and "CC" not in os.environ:
        assert here["compiler"]["source"] == "gcc" and here["compiler"]["path"] == gcc
        assert here["compiler"]["version"]
    monkeypatch.setenv("CC", "no-such-compiler-here")
    named = probe._c_toolchain()["compiler"]
    assert named == {"source": "CC", "command": "no-such-compiler-here", "path": None, "version": None}
    monkeypatch.delenv("CC")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert probe._c_toolchain()["compiler"] is None
    facts = parse_inventory({**_document(), "host": {**_document()["host"], "c_toolchain": probe._c_toolchain()}},
                            label="here").c_toolchain
    assert facts is not None and facts.compiler is None and not facts.runnable and not facts.builds


def test_a_c_toolchain_report_out_of_bounds_is_refused_by_its_key_path() -> None:
    from transplant.errors import ProbeError

    for bad in ({"compiler": {"source": "tcc", "command": "tcc"}}, {"include": "relative/include"},
                {"compiler": {"source": "CC", "command": "x" * 5000}}, {"os": {"id": "d" * 300}}):
        document = _document()
        document["host"]["c_toolchain"] = bad
        with pytest.raises(ProbeError, match="inventory key 'host.c_toolchain"):
            parse_inventory(document, label="here")
def _library(folder, name: str, word: int = 2, link: bool = True):
    """An ELF header of word size ``word`` (2: 64-bit) as ``folder/name``, with ``libcuda.so.1`` linking to it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(b"\x7fELF" + bytes([word]) + b"\0" * 59)
    if link and name != "libcuda.so.1":
        (folder / "libcuda.so.1").symlink_to(name)
    return folder / "libcuda.so.1"


def test_the_loaded_libcuda_follows_the_loaders_order(tmp_path, monkeypatch) -> None:
    compat = _library(tmp_path / "cuda-12.8" / "compat", "libcuda.so.570.124.06")
    driver = _library(tmp_path / "multiarch", "libcuda.so.535.104.05")
    lib32 = _library(tmp_path / "i386", "libcuda.so.535.104.05", word=1)
    cache = (True, [("libcuda.so.1", str(lib32)), ("libcuda.so.1", str(driver)), ("libcuda.so", str(driver))])
    monkeypatch.delenv("LD_LIBRARY_PATH", raising=False)
    assert probe._libcuda_loaded(cache) == {"path": str(driver), "real": str(driver.resolve()),
                                            "version": "535.104.05", "how": "ld.so.cache"}
    monkeypatch.setenv("LD_LIBRARY_PATH", f"::{tmp_path / 'none'}:{compat.parent}")
    assert probe._libcuda_loaded(cache) == {"path": str(compat), "real": str(compat.resolve()),
                                            "version": "570.124.06", "how": "LD_LIBRARY_PATH"}
    plain = _library(tmp_path / "plain", "libcuda.so.1")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(plain.parent))
    assert probe._libcuda_loaded((False, []))["version"] is None
    monkeypatch.delenv("LD_LIBRARY_PATH")
    passed_over = probe._libcuda_loaded((True, [("libcuda.so.1", str(lib32))]))  # a 32-bit one is not loaded
    assert passed_over is None or passed_over["how"] == "default"


def test_a_fifo_named_libcuda_is_passed_over_without_waiting(tmp_path, monkeypatch) -> None:
    import os
    import signal

    planted = tmp_path / "planted"
    planted.mkdir()
    os.mkfifo(planted / "libcuda.so.1")  # opened blocking, it would wait for a writer forever
    driver = _library(tmp_path / "multiarch", "libcuda.so.535.104.05")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(planted))

    def stuck(*_):
        raise AssertionError("the probe waited on a FIFO")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(5)
    try:
        found = probe._libcuda_loaded((True, [("libcuda.so.1", str(driver))]))
        assert probe._regular_head(planted / "libcuda.so.1", 5) is None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert found is not None and found["path"] == str(driver) and found["how"] == "ld.so.cache"


@pytest.mark.parametrize("bad", [{"path": "rel/libcuda.so.1", "real": "/x", "how": "default"},
                                 {"path": "/x\x1b[2J", "real": "/x", "how": "default"},
                                 {"path": "/x", "real": "/x", "version": "570; rm", "how": "default"},
                                 {"path": "/x", "real": "/x", "how": "RUNPATH"}])


def test_a_malformed_loaded_libcuda_is_refused(bad) -> None:
    from transplant.errors import ProbeError

    document = _document()
    document["host"]["libcuda_loaded"] = bad
    with pytest.raises(ProbeError, match="host.libcuda_loaded"):
        parse_inventory(document, label="here")


def test_relative_compiler_settings_are_unknown_not_a_refused_inventory(monkeypatch, tmp_path) -> None:
    """A relative ``TRITON_PTXAS_PATH``, ``CUDA_HOME`` or PATH entry names a file in whatever folder
    the serving process starts in: the probe reports that compiler as unknown, and the inventory
    that carries the report is read (the absolute-path check would refuse it whole)."""
    (tmp_path / "cuda" / "bin").mkdir(parents=True)
    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.8, V12.8.93'\n")
    nvcc.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRITON_PTXAS_PATH", "cuda/bin/ptxas")
    monkeypatch.setenv("CUDA_HOME", "cuda")
    found = probe._jit_compilers()
    assert found["triton_ptxas"] is None and found["nvcc"] is None
    monkeypatch.delenv("CUDA_HOME")
    monkeypatch.setenv("PATH", "cuda/bin")
    assert probe._jit_compilers()["nvcc"] is None
    monkeypatch.setenv("PATH", str(tmp_path / "cuda" / "bin"))
    named = probe._jit_compilers()["nvcc"]
    assert named is not None and named["release"] == "12.8" and named["source"] == "PATH"
    document = _document()
    document["host"]["jit_compilers"] = probe._jit_compilers()
    assert parse_inventory(document, label="here").jit_compilers.nvcc.release == (12, 8)
