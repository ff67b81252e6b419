"""verify between hosts whose systems differ: the donor is the reference.

The donor venv is on trixie; the targets on bookworm (which lacks ``libcbor.so.0.10``, a
library trixie's system provides) and on trixie's twin. A stage that fails in the target and
passes in the donor fails, naming what differs; one that fails the same way in the donor is
not checkable here (a skip, or an unchecked item, with the donor's evidence), unless the
manifest requires it; ``--strict`` fails whatever could not be checked."""

from __future__ import annotations

import json
import textwrap

import pytest

from transplant.cli import main
from transplant.lab.wheels import build_wheel

from system_hosts import shared_python

pytestmark = pytest.mark.hosts

VENV = "/srv/xv"
#: trixie's libfido2: its DT_NEEDED names ``libcbor.so.0.10``, which bookworm's system lacks.
NEEDS_CBOR = "/usr/lib/x86_64-linux-gnu/libfido2.so.1"
#: A package whose import loads its shared library, as packages wrapping a C library do.
LOADS = "import ctypes, os\nctypes.CDLL(os.path.join(os.path.dirname(__file__), '{name}'))\n"
#: A parser that refuses every argument list, on every host.
ALWAYS_REFUSES = "def parse(argv):\n    raise ValueError('no such option: ' + ' '.join(argv))\n"
#: A parser that runs only on a glibc of 2.41 or later (trixie's).
NEEDS_NEW_GLIBC = textwrap.dedent("""\
    import os
    def parse(argv):
        version = tuple(int(x) for x in os.confstr('CS_GNU_LIBC_VERSION').split()[1].split('.'))
        if version < (2, 41):
            raise RuntimeError('glibc %d.%d is too old for this parser' % version)
        class Parsed:
            speculative_algorithm = argv[-1]
        return Parsed()
    """)


@pytest.fixture(scope="module")
def pair(systems, tmp_path_factory):
    """The donor on trixie with ``fido`` (needs libcbor), ``plug`` (needs a library no host has),
    ``refuse`` and ``newglibc`` (the two parsers); empty venvs of the same Python on bookworm and
    on trixie's twin."""
    build = shared_python()
    if build is None:
        pytest.skip("this machine's Python is the system's own: no one build to bind into hosts of two releases")
    trixie = systems.hosts["trixie"]
    fido = trixie.run(["cat", NEEDS_CBOR]).stdout
    wheels = tmp_path_factory.mktemp("xv-wheels")
    tag = "cp311-cp311-linux_x86_64"
    made = [
        build_wheel(wheels, "fido", "1.0", {"fido/__init__.py": LOADS.format(name="libfido.so"),
                                            "fido/libfido.so": fido}, tag=tag),
        build_wheel(wheels, "plug", "1.0", {"plug/__init__.py": LOADS.format(name="libgone.so"),
                                            "plug/libgone.so": fido.replace(b"libcbor.so.0.10", b"libnone.so.0.10")},
                    tag=tag),
        build_wheel(wheels, "refuse", "1.0", {"refuse/__init__.py": ALWAYS_REFUSES}),
        build_wheel(wheels, "newglibc", "1.0", {"newglibc/__init__.py": NEEDS_NEW_GLIBC}),
    ]
    python = f"{build}/bin/python3"
    for name in ("trixie", "bookworm", "trixie-twin"):
        systems.hosts[name].run(["rm", "-rf", VENV, "/srv/xv-wheels"])
        systems.hosts[name].run([python, "-m", "venv", "--without-pip", VENV])
    for wheel in made:
        trixie.install(f"/srv/xv-wheels/{wheel.name}", wheel.read_bytes())
    trixie.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                "--prefix", VENV, *[f"/srv/xv-wheels/{w.name}" for w in made]])
    return systems


def manifest(systems, tmp_path, target: str, verify: str) -> str:
    """A manifest from the trixie donor to ``target`` overlaying all four, with ``verify``."""
    path = tmp_path / f"to-{target}.yaml"
    path.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: "{systems.hosts['trixie'].spec}", venv: {VENV}}}
        target: {{host: "{systems.hosts[target].spec}", venv: {VENV}}}
        ssh: {{identity_file: {systems.identity_file}, known_hosts: {systems.known_hosts}}}
        overlay: [fido, plug, refuse, newglibc]
        """) + verify)
    return str(path)


@pytest.fixture(scope="module")
def applied(pair, tmp_path_factory):
    """The four applied to both targets (``--force``: bookworm's plan blocks on libcbor)."""
    tmp = tmp_path_factory.mktemp("xv")
    for target in ("bookworm", "trixie-twin"):
        assert main(["apply", manifest(pair, tmp, target, ""), "--yes", "--force"]) == 0
    return pair


def verify(path: str, capsys, *flags: str) -> tuple[int, dict]:
    capsys.readouterr()
    code = main(["verify", path, "--json", *flags])
    return code, json.loads(capsys.readouterr().out)


def stages(doc: dict) -> dict[str, dict]:
    return {s["name"]: s for s in doc["stages"]}


IMPORTS = "verify: {imports: [fido, plug]}\n"


def test_a_library_the_targets_system_lacks_fails_verify_naming_it(applied, tmp_path, capsys):
    code, doc = verify(manifest(applied, tmp_path, "bookworm", IMPORTS), capsys)
    imports, native = stages(doc)["imports"], stages(doc)["native-load"]
    assert code == 3 and imports["status"] == "fail" and native["status"] == "fail", (imports["reason"], native["reason"])
    assert "fido" in imports["reason"] and "libcbor.so.0.10: the donor's system has it, this host's has not" \
        in imports["reason"]
    assert "missing libcbor.so.0.10 (the donor's system has it; this host's has not)" in native["reason"]
    # plug fails on the donor too: not the transplant's fault, not checkable better here
    assert [u["item"] for u in imports["unchecked"]] == ["plug"]
    assert imports["unchecked"][0]["cause"] == "donor-identical" and "libnone.so.0.10" in \
        imports["unchecked"][0]["evidence"]


def test_the_twin_with_the_library_passes_and_names_what_it_could_not_check(applied, tmp_path, capsys):
    path = manifest(applied, tmp_path, "trixie-twin", IMPORTS)
    code, doc = verify(path, capsys)
    imports = stages(doc)["imports"]
    assert code == 0 and doc["ok"] is True and imports["status"] == "pass", imports
    assert [(u["item"], u["cause"]) for u in imports["unchecked"]] == [("plug", "donor-identical")]
    assert doc["causes"]["donor-identical"] == ["imports:plug"]
    assert "not checked here: 1 item (fails identically in the donor: imports:plug)" in doc["verdict"]
    # --strict: what could not be checked here fails, and only that
    code, strict = verify(path, capsys, "--strict")
    failed = [s["name"] for s in strict["stages"] if s["status"] == "fail"]
    assert code == 3 and failed == ["imports"], strict["stages"]
    assert stages(strict)["imports"]["reason"].startswith("--strict: 1 not checked here: plug (fails identically")


def test_a_required_stage_fails_even_when_the_donor_fails_it_too(applied, tmp_path, capsys):
    code, doc = verify(manifest(applied, tmp_path, "trixie-twin",
                                "verify: {imports: [fido, plug], required: [imports]}\n"), capsys)
    imports = stages(doc)["imports"]
    assert code == 3 and imports["status"] == "fail" and "plug" in imports["reason"] and not imports["unchecked"]


def server_args(entry: str, required: str = "") -> str:
    return (f"verify:\n  server_args: {{entry: '{entry}', args: [--speculative-algorithm, DFLASH], "
            f"expect: {{speculative_algorithm: DFLASH}}}}\n{required}")


def test_a_parser_failing_identically_in_the_donor_is_a_skip_with_its_evidence(applied, tmp_path, capsys):
    code, doc = verify(manifest(applied, tmp_path, "trixie-twin", server_args("refuse:parse")), capsys)
    args = stages(doc)["server-args"]
    assert code == 0 and args["status"] == "skip" and args["cause"] == "donor-identical", args
    assert args["reason"].startswith("fails identically in the donor (rejected:ValueError)")
    assert args["reason"].endswith("the donor says the same") and args["details"]["donor"]["ok"] is False
    assert "server-args" in doc["causes"]["donor-identical"]
    code, required = verify(manifest(applied, tmp_path, "trixie-twin", server_args("refuse:parse",
                                                                                "  required: [server-args]\n")), capsys)
    assert code == 3 and stages(required)["server-args"]["status"] == "fail"


def test_a_parser_failing_only_on_the_older_glibc_fails_there_and_passes_on_the_twin(applied, tmp_path, capsys):
    code, doc = verify(manifest(applied, tmp_path, "bookworm", server_args("newglibc:parse")), capsys)
    args = stages(doc)["server-args"]
    assert code == 3 and args["status"] == "fail"
    assert "glibc 2.36 is too old" in args["reason"] and args["reason"].endswith("; the donor passes this stage")
    code, twin = verify(manifest(applied, tmp_path, "trixie-twin", server_args("newglibc:parse")), capsys)
    assert code == 0 and stages(twin)["server-args"]["status"] == "pass"



def test_smoke_without_torch_on_either_side_is_a_skip_by_that_fact(applied, tmp_path, capsys):
    code, doc = verify(manifest(applied, tmp_path, "trixie-twin", "verify: {smoke: {device: cuda}}\n"), capsys)
    smoke = stages(doc)["smoke"]
    assert code == 0 and smoke["status"] == "skip" and smoke["cause"] == "no-torch", smoke
    assert smoke["reason"].endswith("the donor's venv has no torch either")
    code, strict = verify(manifest(applied, tmp_path, "trixie-twin", "verify: {smoke: {device: cuda}}\n"), capsys,
                          "--strict")
    assert code == 3 and stages(strict)["smoke"]["status"] == "fail"


def snapshot_of_donor(applied, tmp_path, capsys, verify_block: str) -> dict:
    """A snapshot of the trixie donor taken with ``verify_block``: the donor's verify results are
    recorded in it while the donor is alive."""
    store = tmp_path / "store"
    capsys.readouterr()
    assert main(["snapshot", manifest(applied, tmp_path, "trixie-twin", verify_block), "--out", str(store),
                 "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def from_snapshot(applied, tmp_path, target: str, snap: dict, verify_block: str) -> str:
    """A manifest whose donor is the snapshot (the donor host gone), to ``target``."""
    path = tmp_path / f"snap-to-{target}.yaml"
    path.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{snapshot: {snap['path']}}}
        target: {{host: "{applied.hosts[target].spec}", venv: {VENV}}}
        ssh: {{identity_file: {applied.identity_file}, known_hosts: {applied.known_hosts}}}
        overlay: [fido, plug, refuse, newglibc]
        """) + verify_block)
    return str(path)


#: imports (plug fails everywhere, fido where libcbor is missing) and a parser refusing everywhere
BOTH = ("verify: {imports: [fido, plug], server_args: {entry: 'refuse:parse', args: [--speculative-algorithm, DFLASH], "
        "expect: {speculative_algorithm: DFLASH}}}\n")


def test_a_donor_gone_is_stood_in_for_by_the_results_its_snapshot_recorded(applied, tmp_path, capsys):
    snap = snapshot_of_donor(applied, tmp_path, capsys, BOTH)
    index = json.loads(open(snap["path"], encoding="utf-8").read())
    ran = {r["script"]: r for r in index["donor_verify"]["runs"]}
    assert set(ran) == {"stage_imports", "stage_native", "stage_server_args"}, ran.keys()
    assert {i["name"]: i["ok"] for i in ran["stage_imports"]["report"]["imports"]}["plug"] is False
    # the twin: plug and the parser fail there as they did in the donor, by the record
    code, doc = verify(from_snapshot(applied, tmp_path, "trixie-twin", snap, BOTH), capsys)
    imports, args = stages(doc)["imports"], stages(doc)["server-args"]
    assert code == 0 and imports["status"] == "pass", imports
    assert [(u["item"], u["cause"]) for u in imports["unchecked"]] == [("plug", "donor-identical")]
    assert args["status"] == "skip" and args["cause"] == "donor-identical", args
    assert f"the donor's results recorded with snapshot {snap['id']} on " in args["reason"]
    # bookworm: what fails only there still fails, naming the library its system lacks
    code, doc = verify(from_snapshot(applied, tmp_path, "bookworm", snap, BOTH), capsys)
    imports = stages(doc)["imports"]
    assert code == 3 and imports["status"] == "fail" and "fido" in imports["reason"], imports
    assert "libcbor.so.0.10: the donor's system has it, this host's has not" in imports["reason"]
    assert [u["item"] for u in imports["unchecked"]] == ["plug"]
    assert f"recorded with snapshot {snap['id']}" in imports["reason"]
    # the plain output says what stands in for the donor, and when it was recorded
    capsys.readouterr()
    main(["verify", from_snapshot(applied, tmp_path, "trixie-twin", snap, BOTH)])
    out = capsys.readouterr().out
    assert f"the donor is snapshot {snap['id']}: its verify results recorded on " in out.replace("\n", " ")


def test_a_snapshot_without_recorded_results_excuses_nothing(applied, tmp_path, capsys):
    from transplant.donor.snapshot import _index_digest

    snap = snapshot_of_donor(applied, tmp_path, capsys, BOTH)
    index = json.loads(open(snap["path"], encoding="utf-8").read())
    del index["donor_verify"]  # as a snapshot taken before the donor's results were recorded
    index["digest"] = _index_digest(index)
    with open(snap["path"], "w", encoding="utf-8") as out:
        json.dump(index, out)
    code, doc = verify(from_snapshot(applied, tmp_path, "trixie-twin", snap, BOTH), capsys)
    imports, args = stages(doc)["imports"], stages(doc)["server-args"]
    assert code == 3 and imports["status"] == "fail" and "plug" in imports["reason"] and not imports["unchecked"]
    assert args["status"] == "fail", args
    # a record edited after the snapshot was taken is refused with the whole snapshot
    (tmp_path / "again").mkdir()
    snap2 = snapshot_of_donor(applied, tmp_path / "again", capsys, BOTH)
    text = open(snap2["path"], encoding="utf-8").read().replace('"ok": false', '"ok": true')
    with open(snap2["path"], "w", encoding="utf-8") as out:
        out.write(text)
    capsys.readouterr()
    assert main(["verify", from_snapshot(applied, tmp_path, "trixie-twin", snap2, BOTH)]) != 0
    said = " ".join(capsys.readouterr().out.split())
    assert "hash mismatch" in said and "it was not used" in said, said
