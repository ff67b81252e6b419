"""verify names an illegal instruction (SIGILL) by the CPU flags the target lacks, between hosts
whose CPUs differ.

The donor venv is on trixie, reading this machine's own CPU; the target on bookworm has a CPU
stand-in of x86-64-v3 (no AVX-512, :func:`transplant.lab.standins.set_cpu_level`); trixie's twin
reads this machine's CPU. The kernel still runs this machine's CPU, so a missing feature cannot
make a real SIGILL here: the objects, compiled here with ``cc``, read ``/proc/cpuinfo`` and, when
it lacks ``avx512f``, execute ``ud2`` (``__builtin_trap()``), a real instruction that always
raises SIGILL, as an object built with CPU dispatch dies only on the CPU lacking the feature.
``sigill._kernel`` does it in its module's init (the import dies), ``sigill/libdispatch.so`` in
its constructor (native-load's loader dies on it).

Also the naming itself (``_common.ended``, pure) and the controller's words for it
(``judges.name_cpu_gap``)."""

from __future__ import annotations

import json
import subprocess
import sysconfig
import textwrap

import pytest

from transplant.cli import main
from transplant.lab.standins import remove_cpu, set_cpu_level
from transplant.lab.wheels import build_wheel
from transplant.remote._common import ILLEGAL_INSTRUCTION, died_of, ended, fault_signal, last_import
from transplant.verify.judges import cpu_level, name_cpu_gap

from system_hosts import shared_python, ssh

VENV = "/srv/xsig"

#: Whether /proc/cpuinfo's flags line names FLAG; a trap (ud2: SIGILL) when it does not.
CHECK = textwrap.dedent("""\
    #include <stdio.h>
    #include <string.h>

    static int cpu_has(const char *flag) {
        static char line[65536];
        size_t n = strlen(flag);
        int found = 0;
        FILE *f = fopen("/proc/cpuinfo", "r");
        if (!f) return 0;
        while (fgets(line, sizeof line, f)) {
            if (strncmp(line, "flags", 5) != 0) continue;
            for (char *p = strstr(line, flag); p && !found; p = strstr(p + 1, flag))
                found = (p[-1] == ' ' || p[-1] == '\\t') && (p[n] == ' ' || p[n] == '\\n' || p[n] == '\\0');
            break;
        }
        fclose(f);
        return found;
    }

    static void need_avx512f(void) {
        if (!cpu_has("avx512f")) __builtin_trap();  /* ud2: SIGILL, as AVX-512 code on a CPU without it */
    }
    """)

KERNEL = CHECK + textwrap.dedent("""\
    #include <Python.h>

    static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "_kernel", NULL, -1, NULL};

    PyMODINIT_FUNC PyInit__kernel(void) {
        need_avx512f();
        return PyModule_Create(&def);
    }
    """)

DISPATCH = CHECK + "__attribute__((constructor)) static void dispatch(void) { need_avx512f(); }\n"


def _compile(folder, name: str, source: str, *flags: str) -> bytes:
    (folder / f"{name}.c").write_text(source)
    out = folder / f"{name}.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", *flags, "-o", str(out), str(folder / f"{name}.c")], check=True)
    return out.read_bytes()


@pytest.fixture(scope="module")
def sigill(systems, tmp_path_factory):
    """``sigill`` (its extension module and a library with a constructor, both trapping without
    avx512f) in the trixie donor's venv; empty venvs of the same Python on bookworm (its CPU
    stand-in at x86-64-v3) and trixie's twin; applied to both."""
    build = shared_python()
    if build is None:
        pytest.skip("this machine's Python is the system's own: no one build to bind into hosts of two releases")
    if "avx512f" not in ssh(systems, "trixie-twin", "cat /proc/cpuinfo"):
        pytest.skip("this machine's CPU has no AVX-512: the donor itself would die of the trap")
    tmp = tmp_path_factory.mktemp("sigill")
    files = {"sigill/__init__.py": "from . import _kernel\n",
             f"sigill/_kernel{sysconfig.get_config_var('EXT_SUFFIX')}":
                 _compile(tmp, "kernel", KERNEL, f"-I{sysconfig.get_paths()['include']}"),
             "sigill/libdispatch.so": _compile(tmp, "dispatch", DISPATCH)}
    wheel = build_wheel(tmp, "sigill", "1.0", files, tag="cp311-cp311-linux_x86_64")
    python = f"{build}/bin/python3"
    for name in ("trixie", "bookworm", "trixie-twin"):
        systems.hosts[name].run(["rm", "-rf", VENV])
        systems.hosts[name].run([python, "-m", "venv", "--without-pip", VENV])
    trixie = systems.hosts["trixie"]
    trixie.install(f"/srv/xsig-wheels/{wheel.name}", wheel.read_bytes())
    trixie.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                "--prefix", VENV, f"/srv/xsig-wheels/{wheel.name}"])
    set_cpu_level(systems.hosts["bookworm"], "x86-64-v3")
    try:
        for target in ("bookworm", "trixie-twin"):
            assert main(["apply", manifest(systems, tmp, target), "--yes"]) == 0
        yield systems
    finally:
        remove_cpu(systems.hosts["bookworm"])


def manifest(systems, tmp_path, target: str) -> str:
    path = tmp_path / f"sigill-to-{target}.yaml"
    path.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: "{systems.hosts['trixie'].spec}", venv: {VENV}}}
        target: {{host: "{systems.hosts[target].spec}", venv: {VENV}}}
        ssh: {{identity_file: {systems.identity_file}, known_hosts: {systems.known_hosts}}}
        overlay: [sigill]
        verify: {{imports: [sigill]}}
        """))
    return str(path)


def verify(path: str, capsys) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["verify", path, "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.hosts
def test_an_illegal_instruction_on_the_targets_cpu_fails_naming_the_flags_it_lacks(sigill, tmp_path, capsys):
    assert "x86-64-v3" in ssh(sigill, "bookworm", "cat /proc/cpuinfo")
    code, doc = verify(manifest(sigill, tmp_path, "bookworm"), capsys)
    by = {s["name"]: s for s in doc["stages"]}
    imports, native = by["imports"], by["native-load"]
    assert code == 3 and doc["ok"] is False, doc["verdict"]
    # the import died in the imports process: named, with the module, by the flags the donor's CPU has
    assert imports["status"] == "fail", imports
    assert "while importing sigill: illegal instruction (SIGILL): the CPU lacks avx512f" in imports["reason"]
    assert "which the donor's CPU has (this CPU reaches x86-64-v3" in imports["reason"]
    # the constructor died in native-load's loader child: the file named, the same words
    assert native["status"] == "fail", native
    assert "libdispatch.so" in native["reason"] and "illegal instruction (SIGILL): the CPU lacks avx512f" \
        in native["reason"]
    text = json.dumps(doc)
    assert "exit -4" not in text and "signal 4" not in text and "exit 255" not in text
    assert "fails identically in the donor" not in text  # the donor's CPU runs it: never a skip


@pytest.mark.hosts
def test_the_twin_whose_cpu_has_the_flags_passes(sigill, tmp_path, capsys):
    code, doc = verify(manifest(sigill, tmp_path, "trixie-twin"), capsys)
    by = {s["name"]: s for s in doc["stages"]}
    assert code == 0 and doc["ok"] is True, doc["verdict"]
    assert by["imports"]["status"] == "pass" and by["native-load"]["status"] == "pass", (by["imports"], by["native-load"])


def test_signals_are_named_by_name_and_sigill_as_an_illegal_instruction():
    assert ended(-4) == ILLEGAL_INSTRUCTION == \
        "illegal instruction (SIGILL): the object needs CPU features this CPU lacks"
    assert ended(-11) == "killed by SIGSEGV (segmentation fault)"
    assert ended(-6) == "killed by SIGABRT (aborted)"
    assert ended(-7) == "killed by SIGBUS (bus error)"
    assert ended(3) == "exited with code 3" and ended(0) == "exited with code 0"
    assert ended(-200) == "killed by signal 200" and ended(None) == "ended without an exit status"


def test_the_signal_is_read_from_faulthandlers_line_when_the_exit_status_hides_it():
    err = "transplant: importing torch\ntransplant: importing sigill\nFatal Python error: Illegal instruction\n\n" \
          "Current thread 0x00007f (most recent call first):\n  File \"<frozen importlib._bootstrap>\", line 241\n"
    assert fault_signal(err) == 4 and died_of(255, err) == 4 and last_import(err) == "sigill"
    assert died_of(-11, "") == 11 and died_of(1, "Traceback...\nValueError: x\n") is None
    assert fault_signal("Fatal Python error: Segmentation fault\n") == 11
    assert fault_signal("Fatal Python error: Aborted\n") == 6 and fault_signal("no such line") is None


V3 = {"cmov", "cx8", "fpu", "fxsr", "mmx", "syscall", "sse", "sse2", "cx16", "lahf_lm", "popcnt", "pni",
      "sse4_1", "sse4_2", "ssse3", "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
V4 = V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_vnni", "sha_ni"}


def test_the_illegal_instruction_is_said_by_the_flags_that_differ():
    reason = f"t:/v: the stage_imports script ended while importing x: {ILLEGAL_INSTRUCTION}; its stderr: ..."
    named = name_cpu_gap(reason, V3, V4)
    assert "illegal instruction (SIGILL): the CPU lacks avx512f, avx512bw, avx512cd, avx512dq, avx512vl, " \
           "avx512_vnni, sha_ni, which the donor's CPU has (this CPU reaches x86-64-v3" in named
    assert named.startswith("t:/v: the stage_imports script ended while importing x: ")
    # a snapshot donor: its flags unknown, the target's level said
    assert f"{ILLEGAL_INSTRUCTION} (this CPU reaches x86-64-v3; the donor's CPU flags are unknown)" \
        in name_cpu_gap(reason, V3, None)
    assert "the donor's CPU has no flag this one lacks" in name_cpu_gap(reason, V4, V3)
    assert name_cpu_gap(reason, None, V4) == reason and name_cpu_gap("exited with code 3", V3, V4) == \
        "exited with code 3"
    assert cpu_level(V4) == "x86-64-v4" and cpu_level(V3) == "x86-64-v3" and cpu_level(None) is None


def test_a_stage_script_a_signal_ended_is_named_with_its_import_never_by_its_exit_status():
    from transplant.hosts.host import LocalHost
    from transplant.hosts.probing import _no_reply

    err = (b"transplant: importing sigill\nFatal Python error: Illegal instruction\n\nStack (most recent call "
           b"first):\n  File \"<frozen importlib._bootstrap>\", line 241 in _call_with_frames_removed\n"
           b"  File \"/v/lib/python3.11/site-packages/sigill/__init__.py\", line 1 in <module>\n")
    for status in (-4, 255):  # local: the signal; over SSH: 255, the signal only in faulthandler's line
        said = _no_reply(LocalHost(), "/v", "stage_imports", "/v/bin/python", status, err)
        assert str(said).startswith(f"local:/v: the stage_imports script ended while importing sigill: "
                                    f"{ILLEGAL_INSTRUCTION}; its stderr: Fatal Python error: Illegal instruction")
        assert "sigill/__init__.py" in str(said) and "frozen" not in str(said) and "exit" not in str(said)
        assert said.hint == "see it end by hand: /v/bin/python -c 'import sigill'"
    segv = _no_reply(LocalHost(), "/v", "stage_smoke", "/v/bin/python", -11, b"")
    assert str(segv) == "local:/v: the stage_smoke script ended: killed by SIGSEGV (segmentation fault)"
    plain = _no_reply(LocalHost(), "/v", "stage_smoke", "/v/bin/python", 3, b"boom")
    assert str(plain) == "local:/v: the stage_smoke script failed in the venv's python (exit 3): boom"
