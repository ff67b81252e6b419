"""The ``elf_facts`` host script through :func:`read_elf_facts`, on real shared objects.

Every object is built here with gcc/g++ (the committed fatbin objects come from
``tests/data/fatbin/build.sh``) and read by a venv made without pyelftools, through
:class:`LocalHost`: the script imports the pyelftools source the request carries.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from transplant.core.elf_facts import DeviceCode
from transplant.hosts.elf_facts import elftools_sources, read_elf_facts
from transplant.errors import HostError
from transplant.hosts.host import LocalHost
from transplant.lab.wheels import make_venv
from transplant.hosts.probing import run_script

FATBIN = Path(__file__).parent / "data" / "fatbin"
SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
FX = f"{SITE}/fx"
GLIBC_PUTS = {"x86_64": "GLIBC_2.2.5", "aarch64": "GLIBC_2.17"}

FAKE_C = "int fake_fn(void) { return 2; }\n"
FAKE_MAP = "FAKE_2.0 { global: fake_fn; local: *; };\n"
CONSUMER_C = '#include <stdio.h>\nextern int fake_fn(void);\nint use(void) { puts("x"); return fake_fn(); }\n'
C10_CPP = "namespace c10 { namespace impl { int foo() { return 1; } } }\nnamespace at { int bar() { return 2; } }\n"
EXT_CPP = """
namespace c10 { namespace impl { int foo(); __attribute__((weak)) int maybe(); } }
namespace at { int bar(); }
extern "C" int ext(void) { return c10::impl::foo() + at::bar() + (c10::impl::maybe ? c10::impl::maybe() : 0); }
"""
FOO, BAR, MAYBE = "_ZN3c104impl3fooEv", "_ZN2at3barEv", "_ZN3c104impl5maybeEv"
MADE_UP = "_ZN3c104impl3barEv"


def _cc(compiler: str, out: Path, source: Path, *extra: str) -> Path:
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(out), str(source), *extra], check=True)
    return out


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


def _section(path: Path, name: str) -> tuple[int, int, int]:
    """(section header's file offset, sh_offset, sh_size) of a section, read with pyelftools."""
    with open(path, "rb") as handle:
        elf = ELFFile(handle)
        index = elf.get_section_index(name)
        section = elf.get_section(index)
        return elf["e_shoff"] + index * elf["e_shentsize"], section["sh_offset"], section["sh_size"]


def _build(fx: Path, src: Path, outside: Path) -> None:
    """Build every fixture into ``fx`` (inside the venv); sources in ``src``; ``outside`` out of the venv."""
    fake = _cc("gcc", fx / "libfake.so.2", _write(src / "fake.c", FAKE_C),
               f"-Wl,--version-script={_write(src / 'fake.map', FAKE_MAP)}", "-Wl,-soname,libfake.so.2")
    _cc("gcc", fx / "libconsumer.so", _write(src / "consumer.c", CONSUMER_C), f"-L{fake.parent}", "-l:libfake.so.2")
    c10 = _write(src / "c10.cpp", C10_CPP)
    _cc("g++", fx / "libc10.so", c10, "-Wl,--hash-style=gnu", "-Wl,-soname,libc10.so")
    _cc("g++", fx / "libc10-sysv.so", c10, "-Wl,--hash-style=sysv")
    nohash = _cc("g++", fx / "libc10-nohash.so", c10, "-Wl,--hash-style=gnu")
    header, _, _ = _section(nohash, ".gnu.hash")
    _patch(nohash, header + 4, (1).to_bytes(4, "little"))  # sh_type SHT_GNU_HASH -> SHT_PROGBITS
    ext = _write(src / "ext.cpp", EXT_CPP)
    _cc("g++", fx / "ext.so", ext, f"-L{fx}", "-lc10")
    _cc("g++", fx / "noneed.so", ext)  # the same undefined symbols, without DT_NEEDED libc10.so
    shutil.copyfile(fx / "libc10.so", fx / "arm.so")
    _patch(fx / "arm.so", 18, (183).to_bytes(2, "little"))  # e_machine = EM_AARCH64
    for name in ("libdevice.so", "libdevice-sm80.so"):
        shutil.copyfile(FATBIN / name, fx / name)
    garbage = shutil.copyfile(FATBIN / "libdevice.so", fx / "garbage.so")
    _, start, size = _section(garbage, ".nv_fatbin")
    first = 16 + 80 + 272  # container header, then the PTX entry's header and payload
    _patch(garbage, start + first, b"\xff" * (size - first))
    fake_c = src / "fake.c"
    _cc("gcc", fx / "runpath.so", fake_c, "-Wl,-rpath,/opt/vendor/lib:$ORIGIN/../lib", "-Wl,--enable-new-dtags")
    _cc("gcc", fx / "rpath.so", fake_c, "-Wl,-rpath,/home/builder/lib", "-Wl,--disable-new-dtags")
    _write(fx / "notelf.so", "not an ELF file\n")
    shutil.copyfile(fx / "libc10.so", outside / "libc10.so")
    (fx / "escape.so").symlink_to(outside / "libc10.so")


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A venv without pyelftools whose site-packages holds the fixtures under ``fx/``."""
    root = tmp_path_factory.mktemp("elf")
    made = make_venv(root / "venv")
    fx = made / FX
    fx.mkdir(parents=True)
    (root / "src").mkdir()
    (root / "outside").mkdir()
    _build(fx, root / "src", root / "outside")
    return made


def _read(venv: Path, files, **options):
    return read_elf_facts(LocalHost(), str(venv), [f"{FX}/{name}" for name in files], **options)


def _fx(name: str) -> str:
    return f"{FX}/{name}"


def test_venv_has_no_pyelftools(venv):
    result = subprocess.run([str(venv / "bin" / "python"), "-c", "import elftools"], capture_output=True)
    assert result.returncode == 1
    assert b"No module named 'elftools'" in result.stderr


def test_sources_are_the_controller_package():
    sources = elftools_sources()
    assert "elftools/__init__.py" in sources
    assert "elftools/elf/elffile.py" in sources
    assert all(key.startswith("elftools/") and key.endswith(".py") for key in sources)
    assert not any("/tests/" in key for key in sources)


def test_version_needs_soname_and_needed(venv):
    report = _read(venv, ["libconsumer.so", "libfake.so.2"])
    consumer, fake = report.files[_fx("libconsumer.so")], report.files[_fx("libfake.so.2")]
    assert consumer.error is None
    assert consumer.machine == {"x86_64": "EM_X86_64", "aarch64": "EM_AARCH64"}[platform.machine()]
    assert consumer.elf_class == 64
    assert consumer.soname is None
    assert consumer.needed == ("libfake.so.2", "libc.so.6")
    assert consumer.version_needs["libfake.so.2"] == ("FAKE_2.0",)
    glibc = GLIBC_PUTS.get(platform.machine())
    if glibc:
        assert consumer.version_needs["libc.so.6"] == (glibc,)
    assert set(consumer.version_needs) == {"libfake.so.2", "libc.so.6"}
    assert consumer.torch_undefined == ()
    assert fake.soname == "libfake.so.2"
    assert fake.version_needs.get("libfake.so.2") is None
    assert report.libstdcxx is None
    assert report.defined == {} and report.defined_in == ()
    assert report.label == f"local:{venv}"
    assert report.seconds > 0


def test_run_path_entries_as_written(venv):
    report = _read(venv, ["runpath.so", "rpath.so", "libconsumer.so"])
    runpath, rpath, neither = (report.files[_fx(n)] for n in ("runpath.so", "rpath.so", "libconsumer.so"))
    assert runpath.runpath == ("/opt/vendor/lib", "$ORIGIN/../lib") and runpath.rpath == ()
    assert rpath.rpath == ("/home/builder/lib",) and rpath.runpath == ()
    assert rpath.search_folders == ("/home/builder/lib",)
    assert neither.runpath == () and neither.rpath == () and neither.search_folders == ()


def test_torch_undefined_only_global_and_only_when_linked(venv):
    report = _read(venv, ["ext.so", "noneed.so", "libc10.so"])
    ext = report.files[_fx("ext.so")]
    assert ext.needed[0] == "libc10.so"
    assert ext.torch_undefined == (BAR, FOO)  # the weak c10::impl::maybe is left out
    assert report.files[_fx("noneed.so")].torch_undefined == ()
    assert report.files[_fx("libc10.so")].torch_undefined == ()
    assert report.files[_fx("libc10.so")].soname == "libc10.so"
    assert _read(venv, ["ext.so"], torch_symbols=False).files[_fx("ext.so")].torch_undefined == ()


@pytest.mark.parametrize("lib", ["libc10.so", "libc10-sysv.so", "libc10-nohash.so"],
                         ids=["gnu-hash", "sysv-hash", "dynsym"])
def test_defined_query(venv, lib):
    with open(venv / FX / lib, "rb") as handle:
        types = {s["sh_type"] for s in ELFFile(handle).iter_sections()}
    expected_table = {"libc10.so": "SHT_GNU_HASH", "libc10-sysv.so": "SHT_HASH", "libc10-nohash.so": None}[lib]
    assert expected_table is None or expected_table in types
    assert lib != "libc10-nohash.so" or not types & {"SHT_GNU_HASH", "SHT_HASH"}
    query = ([_fx(lib), _fx("absent.so"), _fx("notelf.so"), "../../etc/passwd"], [FOO, BAR, MADE_UP, MAYBE])
    report = read_elf_facts(LocalHost(), str(venv), [], defined=query)
    assert report.defined == {FOO: True, BAR: True, MADE_UP: False, MAYBE: False}
    assert report.defined_in == (_fx(lib),)
    assert report.files == {}


def test_defined_undefined_symbol_is_not_a_definition(venv):
    report = read_elf_facts(LocalHost(), str(venv), [], defined=([_fx("ext.so")], [FOO, "ext"]))
    assert report.defined == {FOO: False, "ext": True}


def test_rewritten_machine(venv):
    facts = _read(venv, ["arm.so"]).files[_fx("arm.so")]
    assert facts.error is None
    assert facts.machine == "EM_AARCH64"
    assert facts.soname == "libc10.so"


def test_device_code_of_committed_fatbins(venv):
    report = _read(venv, ["libdevice.so", "libdevice-sm80.so", "libc10.so"], device_code=True)
    assert report.files[_fx("libdevice.so")].device_code == (
        DeviceCode(kind="ptx", arch=90),
        DeviceCode(kind="sass", arch=90),
        DeviceCode(kind="sass", arch=90, variant="a"),
        DeviceCode(kind="sass", arch=120, variant="a"),
    )
    assert [d.name for d in report.files[_fx("libdevice.so")].device_code] == [
        "compute_90", "sm_90", "sm_90a", "sm_120a"]
    assert report.files[_fx("libdevice-sm80.so")].device_code == (
        DeviceCode(kind="sass", arch=80),
        DeviceCode(kind="sass", arch=100, variant="f"),
    )
    assert report.files[_fx("libc10.so")].device_code == ()
    assert _read(venv, ["libdevice.so"]).files[_fx("libdevice.so")].device_code == ()


def test_device_code_stops_at_garbage(venv):
    facts = _read(venv, ["garbage.so"], device_code=True).files[_fx("garbage.so")]
    assert facts.error is None
    assert facts.device_code == (DeviceCode(kind="ptx", arch=90),)


def test_libstdcxx(venv):
    report = read_elf_facts(LocalHost(), str(venv), [], libstdcxx=True)
    assert report.libstdcxx is not None
    path = report.libstdcxx.path
    assert os.path.isabs(path) and os.path.basename(path).startswith("libstdc++.so.6")
    assert path == os.path.realpath(path)
    versions = report.libstdcxx.versions
    assert "GLIBCXX_3.4" in versions and "CXXABI_1.3" in versions
    assert any(v.startswith("GLIBCXX_3.4.") for v in versions)
    assert "libstdc++.so.6" not in versions  # the base definition (the soname) is left out


def test_bad_files_get_errors_and_the_others_are_still_read(venv):
    files = [_fx("notelf.so"), _fx("absent.so"), "../../etc/passwd", _fx("escape.so"), "/etc/passwd",
             f"{FX}/../../../../../etc/passwd", FX, _fx("libc10.so")]
    report = read_elf_facts(LocalHost(), str(venv), files)
    errors = {rel: facts.error for rel, facts in report.files.items()}
    assert errors == {
        _fx("notelf.so"): "not an ELF file (starts with b'not ')",
        _fx("absent.so"): "cannot open: No such file or directory",
        "../../etc/passwd": f"refused: '../../etc/passwd' leaves the venv {venv}",
        _fx("escape.so"): f"refused: {_fx('escape.so')!r} leaves the venv {venv}",
        "/etc/passwd": "refused: '/etc/passwd' is not a venv-relative path",
        f"{FX}/../../../../../etc/passwd": f"refused: '{FX}/../../../../../etc/passwd' leaves the venv {venv}",
        FX: "not a regular file",
        _fx("libc10.so"): None,
    }
    assert report.files[_fx("notelf.so")].needed == ()
    assert report.files[_fx("libc10.so")].soname == "libc10.so"


def test_missing_venv_is_a_host_error(tmp_path):
    with pytest.raises(HostError, match="does not exist"):
        read_elf_facts(LocalHost(), str(tmp_path / "nope"), [])


def test_unimportable_pyelftools_is_a_host_error(venv):
    request = {"modules": {"elftools/__init__.py": ""}, "files": []}
    with pytest.raises(HostError, match=r"cannot import the pyelftools sent with the request in Python 3\.\d+\.\d+: "
                                        r"ModuleNotFoundError: No module named 'elftools\.elf'"):
        run_script(LocalHost(), str(venv), "elf_facts", request=request)


def test_fatbin_with_many_distinct_entries_is_capped():
    """A crafted fatbin with more distinct entries than any real one is read up to a cap (the
    de-duplication is a dict, so this stays linear)."""
    import io
    import struct

    import transplant.remote.elf_facts as module
    count = module.FATBIN_MAX_ENTRIES + 500
    entries = b"".join(struct.pack("<HHIQIIHHIIIQQQ", 2, 0x101, 64, 0, 0, 0, 8, 1, arch, 0, 0, 0x11, 0, 0)
                       for arch in range(1, count + 1))
    blob = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(entries)) + entries
    found = module.fatbin_entries(io.BytesIO(blob), 0, len(blob))
    assert len(found) == module.FATBIN_MAX_ENTRIES
    assert found[0] == {"kind": "sass", "arch": 1, "variant": ""}
