"""Snapshots on real sshd hosts: capture, the donor stopped, apply and verify from the snapshot;
deduplication; a tampered store; a missing snapshot; fallbacks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from transplant.cli.app import main
from transplant.lab import Lab
from transplant.lab.wheels import build_wheel

from conftest import lab_skip_reason

VENV = "/srv/snap-venv"
SITE = "lib/python3.11/site-packages"
#: A real shared object that loads (verify's native-load stage dlopens it), built with gcc by the fixture.
ELF = Path(tempfile.mkdtemp(prefix="transplant-snapelf-", dir="/tmp")) / "libdevice.so"


def _build_elf() -> None:
    source = ELF.with_name("device.c")
    source.write_text("int device_answer(void) { return 42; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(ELF), str(source)], check=True)
NAMES = ("donor", "t1", "t2", "t3", "t4", "t5")


def _python() -> str:
    return getattr(sys, "_base_executable", sys.executable)


def install(host, wheels) -> None:
    host.run(["rm", "-rf", VENV])
    host.run([_python(), "-m", "venv", "--without-pip", VENV])
    host.run([_python(), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
              "--target", f"{VENV}/{SITE}", *map(str, wheels)])


@pytest.fixture(scope="module")
def snaplab(tmp_path_factory):
    """Its own lab (the donor gets stopped): donor with alpha 1.1 (a real ELF library inside) and
    beta 2.0 (needs alpha>=1.1); targets t1..t5 with alpha 1.0."""
    reason = lab_skip_reason()
    if reason:
        pytest.skip(reason)
    directory = Path(tempfile.mkdtemp(prefix="transplant-snaplab-", dir="/tmp"))
    wheels = tmp_path_factory.mktemp("snapwheels")
    _build_elf()
    a1 = build_wheel(wheels, "alpha", "1.0", {"alpha/__init__.py": "__version__ = '1.0'\n"})
    a2 = build_wheel(wheels, "alpha", "1.1", {"alpha/__init__.py": "__version__ = '1.1'\n",
                                              "alpha/libdevice.so": ELF.read_bytes(),
                                              "alpha/same.py": "SAME = 1\n"})
    b = build_wheel(wheels, "beta", "2.0", {"beta/__init__.py": "import alpha\n__version__ = '2.0'\n"},
                    requires=("alpha>=1.1",))
    try:
        with Lab(directory, NAMES) as lab:
            install(lab.hosts["donor"], [a2, b])
            for name in NAMES[1:]:
                install(lab.hosts[name], [a1])
            yield lab
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(autouse=True)
def _own_state(tmp_path, monkeypatch):
    """Each test its own state folder: its own snapshot store and log of verified states."""
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))


def write_manifest(folder: Path, lab, *, donor: str | None = None, target: str = "t1", extra: str = "",
                   overlay: str = "[alpha, beta]", name: str = "m.yaml") -> str:
    (folder / "patches").mkdir(parents=True, exist_ok=True)
    (folder / "patches" / "tuned.py").write_text("TUNED = 15\n")
    donor = donor or f'{{host: "{lab.hosts["donor"].spec}", venv: {VENV}}}'
    text = textwrap.dedent(f"""\
        version: 1
        donor: {donor}
        target: {{host: "{lab.hosts[target].spec}", venv: {VENV}}}
        ssh: {{identity_file: {lab.identity_file}, known_hosts: {lab.known_hosts}, connect_timeout: 3}}
        overlay: {overlay}
        patches:
          - {{source: patches/tuned.py, dest: alpha/tuned.py}}
        verify:
          imports: [alpha, beta, alpha.tuned]
        """) + extra
    path = folder / name
    path.write_text(text)
    return str(path)


def files_of(lab, name: str) -> dict[str, bytes]:
    root = lab.hosts[name].path(f"{VENV}/{SITE}")
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts and not p.name == "RECORD"
            and ".dist-info" not in str(p.relative_to(root))}


def snapshot(capsys, manifest: str, store: Path) -> dict:
    assert main(["snapshot", manifest, "--out", str(store), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_snapshot_then_donor_gone_apply_and_verify_from_it(snaplab, tmp_path, capsys):
    lab = snaplab
    store = tmp_path / "store"
    m = write_manifest(tmp_path, lab)
    first = snapshot(capsys, m, store)
    assert first["fetched"] > 0 and first["reused"] == 0 and first["bytes_read"] > ELF.stat().st_size
    objects = sorted(p.name for p in (store / "objects").glob("*/*"))
    assert len(objects) == first["fetched"] + 1, "every donor file once, plus the patch"

    again = snapshot(capsys, m, store)
    assert again["fetched"] == 0 and again["bytes_read"] == 0, "a file already stored is not read again"
    # the same content: the same snapshot (content-addressed), no second index
    assert again["reused"] >= first["fetched"] and again["id"] == first["id"] and again["existing"] is True
    assert first["existing"] is False
    assert sorted(p.name for p in (store / "objects").glob("*/*")) == objects

    assert main(["snapshot", "--list", "--out", str(store), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["snapshots"]
    assert [s["id"] for s in listed] == [first["id"]]
    assert listed[0]["dists"] == ["alpha", "beta"]

    lab.hosts["donor"].stop_sshd()
    try:
        assert main(["plan", m]) == 1, "the donor is gone"
        capsys.readouterr()
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        shutil.copytree(tmp_path / "patches", fresh / "patches")
        ms = write_manifest(fresh, lab, donor=f"{{snapshot: {again['path']}}}")
        assert main(["plan", "--detailed-exitcode", ms, "--json"]) == 2
        doc = json.loads(capsys.readouterr().out)
        assert doc["donor_source"]["which"] == "donor"
        assert doc["donor_source"]["source"].startswith(f"snapshot {again['id']} of {lab.hosts['donor'].spec}")
        codes = {f["code"] for f in doc["findings"]}
        assert "binary-unreadable" not in codes, "the ELF library was read from the snapshot's view"
        alpha = [c for c in doc["changes"] if c["name"] == "alpha"][0]
        assert alpha["action"] == "upgrade" and alpha["to_version"] == "1.1"

        assert main(["apply", ms, "--yes"]) == 0
        out = capsys.readouterr().out
        assert f"snapshot {again['id']}" in out
        assert main(["verify", ms, "--json"]) == 0
        stages = {s["name"]: s["status"] for s in json.loads(capsys.readouterr().out)["stages"]}
        assert stages["imports"] == "pass" and stages["requirements"] == "pass"
        target = files_of(lab, "t1")
        donor = files_of(lab, "donor")
        assert {k: v for k, v in target.items() if k != "alpha/tuned.py"} == donor
        assert target["alpha/tuned.py"] == b"TUNED = 15\n"
        assert main(["apply", ms, "--yes", "--verify"]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert "nothing to change" in out and "verify passed" in out
        assert "cannot be reached" not in out and out.count(f"donor source: snapshot {again['id']}") == 2
    finally:
        lab.hosts["donor"].start_sshd()


def test_tampered_store_file_is_a_hash_mismatch_and_nothing_changes(snaplab, tmp_path, capsys):
    lab = snaplab
    store = tmp_path / "store"
    snap = snapshot(capsys, write_manifest(tmp_path, lab), store)
    index = json.loads(Path(snap["path"]).read_text())
    digest = index["files"][f"{SITE}/alpha/libdevice.so"]["hash"]
    from transplant.donor.store import object_path

    victim = object_path(store, digest)
    os.chmod(victim, 0o644)
    victim.write_bytes(b"\x7fELF not what was stored")
    before = files_of(lab, "t2")
    ms = write_manifest(tmp_path, lab, donor=f"{{snapshot: {snap['path']}}}", target="t2", name="s.yaml")
    assert main(["apply", ms, "--yes"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "hash mismatch" in out and victim.name in out.replace(" ", "") and "take the snapshot again" in out
    assert files_of(lab, "t2") == before


def test_missing_snapshot_and_narrower_snapshot_are_clear_errors(snaplab, tmp_path, capsys):
    lab = snaplab
    ms = write_manifest(tmp_path, lab, donor="{snapshot: nowhere/none.json}", target="t2")
    assert main(["plan", ms]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "snapshot nowhere/none.json: not found" in out and "transplant snapshot --list" in out

    store = tmp_path / "store"
    snap = snapshot(capsys, write_manifest(tmp_path, lab, overlay="[alpha]", name="a.yaml"), store)
    wide = write_manifest(tmp_path, lab, donor=f"{{snapshot: {snap['path']}}}", target="t2", name="w.yaml")
    assert main(["plan", wide]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "holds the files of alpha only; the overlay also selects beta" in out


def test_fallback_is_tried_in_order_and_plan_says_why(snaplab, tmp_path, capsys):
    lab = snaplab
    store = tmp_path / "store"
    snap = snapshot(capsys, write_manifest(tmp_path, lab), store)
    dead = "root@127.0.0.250:9"  # loopback, nothing listens there
    donor = f'{{host: "{dead}", venv: {VENV}, fallback: [{{snapshot: gone.json}}, {{snapshot: {snap["path"]}}}]}}'
    m = write_manifest(tmp_path, lab, donor=donor, target="t3", name="f.yaml")
    assert main(["plan", "--detailed-exitcode", m, "--json"]) == 2
    used = json.loads(capsys.readouterr().out)["donor_source"]
    assert used["which"] == "donor.fallback[1]"
    assert used["source"].startswith(f"snapshot {snap['id']}")
    assert used["why"].startswith(f"donor.fallback[1], because donor ({dead}:{VENV}) cannot be used: ")
    assert "donor.fallback[0] (snapshot gone.json) cannot be used: snapshot gone.json: not found" in used["why"]

    none_left = f'{{host: "{dead}", venv: {VENV}, fallback: [{{snapshot: gone.json}}]}}'
    m = write_manifest(tmp_path, lab, donor=none_left, target="t3", name="g.yaml")
    assert main(["plan", m]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "no donor source can be used" in out and "donor.fallback[0] (snapshot gone.json)" in out


def test_prune_keeps_what_a_snapshot_still_uses(snaplab, tmp_path, capsys):
    lab = snaplab
    store = tmp_path / "store"
    one = snapshot(capsys, write_manifest(tmp_path, lab, overlay="[alpha]", name="a.yaml"), store)
    two = snapshot(capsys, write_manifest(tmp_path, lab, name="b.yaml"), store)
    every = {p.name for p in (store / "objects").glob("*/*")}
    assert main(["snapshot", "--prune", "nope", "--out", str(store)]) == 1
    assert "no snapshot nope; nothing was removed" in " ".join(capsys.readouterr().out.split())
    assert main(["snapshot", "--prune", two["id"], "--out", str(store)]) == 0
    assert "pruned 1 snapshot " in capsys.readouterr().out
    left = {p.name for p in (store / "objects").glob("*/*")}
    assert left < every, "beta's files went with the snapshot that alone used them"
    kept = json.loads(Path(one["path"]).read_text())
    from transplant.donor.store import object_key

    assert {object_key(f["hash"]) for f in kept["files"].values() if "hash" in f} <= left
    assert main(["snapshot", "--prune", one["id"], "--out", str(store)]) == 0
    capsys.readouterr()
    assert not list((store / "objects").glob("*/*"))


def accepted(lab, name: str) -> int:
    """SSH logins the host's sshd accepted so far (its log)."""
    return lab.hosts[name].log.read_text(errors="replace").count("Accepted publickey")


def test_fleet_plan_apply_verify_one_broken_host_and_the_donor_read_once(snaplab, tmp_path, capsys, monkeypatch):
    lab = snaplab
    monkeypatch.setenv("TRANSPLANT_SSH_PERSIST", "0")  # the apply's own logins counted, not the plan's master ridden
    wheels = tmp_path / "w"
    old = build_wheel(wheels, "alpha", "1.0", {"alpha/__init__.py": "__version__ = '1.0'\n"})
    good = ["t1", "t2", "t3", "t4"]
    for name in good + ["t5"]:
        install(lab.hosts[name], [old])
    lab.hosts["t5"].run(["rm", f"{VENV}/bin/python"])  # the broken host: its venv's python is gone
    targets = "targets:\n" + "".join(f'  - {{host: "{lab.hosts[n].spec}", venv: {VENV}}}\n' for n in good + ["t5"])
    m = write_manifest(tmp_path, lab, name="fleet.yaml")
    Path(m).write_text(Path(m).read_text().replace(f'target: {{host: "{lab.hosts["t1"].spec}", venv: {VENV}}}\n',
                                                   targets))

    assert main(["plan", m, "--json", "--jobs", "3"]) == 1
    report = json.loads(capsys.readouterr().out)
    by = {t["target"]: t for t in report["targets"]}
    broken = f"{lab.hosts['t5'].spec}:{VENV}"
    assert by[broken]["code"] == 1 and "does not exist or points to nothing" in by[broken]["error"]
    assert [by[f"{lab.hosts[n].spec}:{VENV}"]["code"] for n in good] == [2, 2, 2, 2]
    assert report["donor"]["files_read"] > 0

    logins = accepted(lab, "donor")
    assert main(["apply", m, "--yes", "--verify", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert accepted(lab, "donor") - logins == 1, "one SSH login on the donor for the whole fleet (the probe)"
    assert report["donor"]["files_read"] == 0 and report["donor"]["bytes_read"] == 0, \
        "the plan's snapshot already holds every file: nothing is read from the donor again"
    by = {t["target"]: t for t in report["targets"]}
    assert by[broken]["code"] == 1 and by[broken]["result"] == "failed"
    donor_files = files_of(lab, "donor")
    for n in good:
        one = by[f"{lab.hosts[n].spec}:{VENV}"]
        assert one["code"] == 0 and one["applied"]["files"] > 0, one
        assert {s["name"]: s["status"] for s in one["stages"]}["imports"] == "pass"
        got = files_of(lab, n)
        assert got.pop("alpha/tuned.py") == b"TUNED = 15\n" and got == donor_files

    assert main(["verify", m, "--json"]) == 3, "as for one target: its stages fail, so verify fails (exit 3)"
    report = json.loads(capsys.readouterr().out)
    assert [t["code"] for t in report["targets"]] == [0, 0, 0, 0, 3]
    assert {s["status"] for s in report["targets"][-1]["stages"]} == {"fail", "skip"}
    # fixed, the same command succeeds everywhere, and the exit code says so
    install(lab.hosts["t5"], [old])
    assert main(["apply", m, "--yes", "--verify"]) == 0
    assert "apply: all 5 targets succeeded" in capsys.readouterr().out


def test_fleet_donor_reads_do_not_grow_with_the_number_of_targets(snaplab, tmp_path, capsys, monkeypatch):
    lab = snaplab
    old = build_wheel(tmp_path / "w", "alpha", "1.0", {"alpha/__init__.py": "__version__ = '1.0'\n"})
    reads = {}
    for count in (2, 4):
        monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / f"state{count}"))  # an empty store each time
        names = ["t1", "t2", "t3", "t4"][:count]
        for name in names:
            install(lab.hosts[name], [old])
        args = [a for n in names for a in ("--target", f"{lab.hosts[n].spec}:{VENV}")]
        logins = accepted(lab, "donor")
        assert main(["apply", write_manifest(tmp_path, lab), "--yes", "--json", *args]) == 0
        report = json.loads(capsys.readouterr().out)
        assert [t["code"] for t in report["targets"]] == [0] * count
        reads[count] = (accepted(lab, "donor") - logins, report["donor"]["bytes_read"], report["donor"]["files_read"])
    assert reads[2][0] == reads[4][0] == 1, \
        "one login on the donor (the probe and rsync share one master connection), whatever the fleet"
    assert reads[2][2] == reads[4][2], "the same files read from the donor"
    assert abs(reads[4][1] - reads[2][1]) < 100 and reads[4][1] > ELF.stat().st_size, \
        "the same bytes, but for a few bytes of rsync's protocol"


def ssh_args(lab) -> list[str]:
    return ["--identity-file", str(lab.identity_file), "--known-hosts", str(lab.known_hosts)]


def test_status_says_what_was_applied_from_where_and_what_drifted(snaplab, tmp_path, capsys):
    lab = snaplab
    old = build_wheel(tmp_path / "w", "alpha", "1.0", {"alpha/__init__.py": "__version__ = '1.0'\n"})
    install(lab.hosts["t3"], [old])
    where = f"{lab.hosts['t3'].spec}:{VENV}"
    assert main(["status", where, *ssh_args(lab)]) == 0
    assert "transplant has applied nothing here" in " ".join(capsys.readouterr().out.split())

    m = write_manifest(tmp_path, lab, target="t3")
    assert main(["apply", m, "--yes", "--verify"]) == 0
    capsys.readouterr()
    assert main(["status", where, "--json", *ssh_args(lab)]) == 0
    doc = json.loads(capsys.readouterr().out)
    (applied,) = doc["transactions"]
    assert applied["source"] == f"donor {lab.hosts['donor'].spec}:{VENV}"
    assert applied["verified"] is True and applied["manifest"] == str(Path(m).resolve())
    assert doc["drift"] == [] and doc["checked"] > 3 and applied["applied"] is not None

    lab.hosts["t3"].path(f"{VENV}/{SITE}/alpha/same.py").write_text("SAME = 2  # edited by hand\n")
    assert main(["status", where, *ssh_args(lab)]) == 3
    out = " ".join(capsys.readouterr().out.split())
    assert f"drift: 1 of {doc['checked']} applied paths no longer match" in out and f"{SITE}/alpha/same.py" in out


def test_recover_rebuilds_from_history_alone_with_the_donor_gone(snaplab, tmp_path, capsys):
    lab = snaplab
    old = build_wheel(tmp_path / "w", "alpha", "1.0", {"alpha/__init__.py": "__version__ = '1.0'\n"})
    for name in ("t3", "t4"):
        install(lab.hosts[name], [old])
    source = f"{lab.hosts['t3'].spec}:{VENV}"
    assert main(["recover", "--from", source, "--target", lab.hosts["t4"].spec, "--yes", *ssh_args(lab)]) == 1
    assert "no transaction there was applied and then verified" in " ".join(capsys.readouterr().out.split())

    m = write_manifest(tmp_path, lab, target="t3")
    assert main(["apply", m, "--yes", "--verify"]) == 0
    capsys.readouterr()
    lab.hosts["donor"].stop_sshd()
    try:
        assert main(["recover", "--from", source, "--target", lab.hosts["t4"].spec, "--yes", *ssh_args(lab)]) == 0
        out = " ".join(capsys.readouterr().out.split())
        for step in ("recover: 1/3 plan", "recover: 2/3 apply", "recover: 3/3 verify", "verify passed", "recovered"):
            assert step in out
        assert f"donor source: {source}" in out
        assert files_of(lab, "t4") == files_of(lab, "t3")
        assert files_of(lab, "t4")["alpha/tuned.py"] == b"TUNED = 15\n"
        # a drifted source is refused: it no longer holds the verified state
        lab.hosts["t3"].path(f"{VENV}/{SITE}/alpha/same.py").write_text("SAME = 3\n")
        install(lab.hosts["t4"], [old])
        assert main(["recover", "--from", source, "--target", lab.hosts["t4"].spec, "--yes", *ssh_args(lab)]) == 1
        out = " ".join(capsys.readouterr().out.split())
        assert "1 applied file changed since" in out and "alpha/same.py" in out
    finally:
        lab.hosts["donor"].start_sshd()


def test_recover_from_a_snapshot_and_bad_targets(snaplab, tmp_path, capsys):
    lab = snaplab
    old = build_wheel(tmp_path / "w", "alpha", "1.0", {"alpha/__init__.py": "__version__ = '1.0'\n"})
    install(lab.hosts["t2"], [old])
    snap = snapshot(capsys, write_manifest(tmp_path, lab), tmp_path / "state" / "snapshots")
    lab.hosts["donor"].stop_sshd()
    try:
        assert main(["recover", "--target", f"{lab.hosts['t2'].spec}:{VENV}", "--yes"]) == 0, \
            "the newest snapshot in the store, the ssh settings from its manifest"
        out = " ".join(capsys.readouterr().out.split())
        assert f"rebuilding snapshot {snap['id']}" in out and "recovered" in out
        got = files_of(lab, "t2")
        assert got.pop("alpha/tuned.py") == b"TUNED = 15\n" and got == files_of(lab, "donor")
    finally:
        lab.hosts["donor"].start_sshd()
    assert main(["recover", "--snapshot", "nope", "--target", lab.hosts["t2"].spec]) == 1
    assert "snapshot nope: not found" in " ".join(capsys.readouterr().out.split())
    # without a terminal and without --yes: the hint is recover's own (apply's would skip verify)
    assert main(["recover", "--target", f"{lab.hosts['t2'].spec}:{VENV}", "--snapshot", snap["id"]]) == 1
    said = " ".join(capsys.readouterr().out.split())
    assert "recover needs confirmation" in said and "add --yes to this recover command" in said
    assert "transplant apply" not in said
    assert main(["recover", "--target", "bad host!", "--snapshot", snap["id"]]) == 64
    assert "--target 'bad host!'" in capsys.readouterr().out
    m = write_manifest(tmp_path, lab)
    assert main(["plan", m, "--target", "no-venv-here"]) == 64
    assert "expected HOST:VENV" in capsys.readouterr().out
    assert main(["plan", m, "--target", f"root@127.0.0.250:9:{VENV}", "--target", f"{lab.hosts['t1'].spec}:{VENV}",
                 "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["targets"][0]["code"] == 1 and "127.0.0.250" in report["targets"][0]["error"]
    assert report["targets"][1]["code"] in (0, 2)


def test_recover_without_a_source_takes_the_last_verified_state_then_its_snapshot(snaplab, tmp_path, capsys):
    lab = snaplab
    old = build_wheel(tmp_path / "w", "alpha", "1.0", {"alpha/__init__.py": "__version__ = '1.0'\n"})
    for name in ("t3", "t4"):
        install(lab.hosts[name], [old])
    snap = snapshot(capsys, write_manifest(tmp_path, lab), tmp_path / "elsewhere")  # not the default store
    fresh = tmp_path / "from-snapshot"
    fresh.mkdir()
    shutil.copytree(tmp_path / "patches", fresh / "patches")
    assert main(["apply", write_manifest(fresh, lab, donor=f"{{snapshot: {snap['path']}}}", target="t3"), "--yes",
                 "--verify"]) == 0
    capsys.readouterr()
    lab.hosts["donor"].stop_sshd()
    try:
        assert main(["recover", "--target", lab.hosts["t4"].spec, "--yes"]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert "a state this controller saw verified: transaction" in out
        assert f"on {lab.hosts['t3'].spec}:{VENV}" in out and f"donor source: {lab.hosts['t3'].spec}:{VENV}" in out
        assert files_of(lab, "t4") == files_of(lab, "t3")
        # both hosts that hold the state go down: t4 (recovered from t3, no snapshot of its own), then t3,
        # whose state came from a snapshot: that snapshot rebuilds it on t2
        install(lab.hosts["t2"], [old])
        lab.hosts["t3"].stop_sshd()
        lab.hosts["t4"].stop_sshd()
        assert main(["recover", "--target", lab.hosts["t2"].spec, "--yes"]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert out.index(f"{lab.hosts['t4'].spec}:{VENV} cannot be used") < \
            out.index(f"{lab.hosts['t3'].spec}:{VENV} cannot be used")
        assert f"using the snapshot it was applied from: {snap['path']}" in out and "recovered" in out
        got = files_of(lab, "t2")
        assert got.pop("alpha/tuned.py") == b"TUNED = 15\n" and got == files_of(lab, "donor")
    finally:
        for name in ("t3", "t4", "donor"):
            lab.hosts[name].start_sshd()


def test_an_edited_snapshot_index_is_refused(snaplab, tmp_path, capsys):
    lab = snaplab
    snap = snapshot(capsys, write_manifest(tmp_path, lab), tmp_path / "store")
    index = Path(snap["path"])
    doc = json.loads(index.read_text())
    doc["files"][f"{SITE}/alpha/same.py"]["mode"] = 0o4755  # setuid, by hand
    index.write_text(json.dumps(doc))
    ms = write_manifest(tmp_path, lab, donor=f"{{snapshot: {snap['path']}}}", target="t2", name="s.yaml")
    assert main(["plan", ms]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "hash mismatch: the index was changed after it was written" in out and "take the snapshot again" in out
