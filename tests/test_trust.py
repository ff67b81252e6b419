"""Trust: no stale plan is committed, nothing recorded on a host lowers the controller's
SSH checks, a target that is the donor under another name is refused, hostile files get one clear
error, crashes leave exact records. Local venvs (real applier processes) unless a test needs sshd."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

import transplant.apply.execute as cli  # the module of execute, which every apply calls (looked up where it is used)
from transplant.cli.app import main
from transplant.lab.wheels import build_wheel, make_venv

SITE = "lib/python3.11/site-packages"


@pytest.fixture
def pair(tmp_path, monkeypatch):
    """A local donor (foo 2.0), a second donor (foo 3.0 and bar 1.0), a target (foo 1.0) and a
    manifest for each donor; the state folder inside tmp_path."""
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    wheels = tmp_path / "wheels"
    two = build_wheel(wheels, "foo", "2.0", {"foo/__init__.py": "V = 2\n", "foo/extra.py": "E = 1\n"})
    three = build_wheel(wheels / "3", "foo", "3.0", {"foo/__init__.py": "V = 3\n", "foo/third.py": "T = 3\n"})
    bar = build_wheel(wheels, "bar", "1.0", {"bar/__init__.py": "B = 1\n"})
    one = build_wheel(wheels / "1", "foo", "1.0", {"foo/__init__.py": "V = 1\n", "foo/gone.py": "G = 1\n"})
    make_venv(tmp_path / "donor", [two])
    make_venv(tmp_path / "donor3", [three, bar])
    make_venv(tmp_path / "target", [one])
    for name, donor in (("m.yaml", "donor"), ("m3.yaml", "donor3")):
        (tmp_path / name).write_text(textwrap.dedent(f"""\
            version: 1
            donor: {{host: local, venv: {tmp_path / donor}}}
            target: {{host: local, venv: {tmp_path / 'target'}}}
            overlay: [foo]
            """))
    return tmp_path


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` except transplant's own state folder and bytecode."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".transplant" not in p.parts and "__pycache__" not in p.parts}


def _site(root: Path) -> Path:
    return root / SITE


# -- 1. a plan made before another apply is never committed over it ------------------------------

def _another_apply(tmp_path: Path) -> None:
    assert main(["apply", str(tmp_path / "m3.yaml"), "--yes"]) == 0


def _hand_edit(tmp_path: Path) -> None:
    (_site(tmp_path / "target") / "foo" / "__init__.py").write_text("V = 'edited'\n")


def _pip_install(tmp_path: Path) -> None:
    wheel = next((tmp_path / "wheels").glob("bar-*.whl"))
    subprocess.run([shutil.which("python3") or "python3", "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                    "--disable-pip-version-check", "--target", str(_site(tmp_path / "target")), str(wheel)],
                   check=True)


def _remove_a_file(tmp_path: Path) -> None:
    (_site(tmp_path / "target") / "foo" / "gone.py").unlink()


@pytest.mark.parametrize("change, saved", [(_another_apply, False), (_hand_edit, False), (_pip_install, False),
                                            (_remove_a_file, False), (_another_apply, True)],
                         ids=["another-apply-landed", "hand-edit", "pip-install", "file-removed", "saved-plan"])
def test_a_plan_made_before_the_target_changed_is_refused_under_the_lock(pair, capsys, monkeypatch, change, saved):
    """The change lands after the plan was made and before the lock is taken (as when an apply
    waits at its [y/N] prompt): the apply is refused as stale and writes nothing."""
    tmp_path = pair
    real = cli.execute
    pending = [change]

    def racing(plan, **kwargs):
        if pending:
            pending.pop()(tmp_path)
        return real(plan, **kwargs)

    monkeypatch.setattr(cli, "execute", racing)
    source = str(tmp_path / "m.yaml")
    if saved:
        assert main(["plan", "--detailed-exitcode", source, "--out", str(tmp_path / "p.json")]) == 2
        source = str(tmp_path / "p.json")
    capsys.readouterr()
    code = main(["apply", source, "--yes"])
    out = " ".join(capsys.readouterr().out.split())
    if change is _another_apply:
        after = tree(tmp_path / "target")
    assert code == 1, out
    assert "refusing a stale plan: the target changed since the plan was made" in out
    assert f"transplant plan {tmp_path / 'm.yaml'}" in out
    infos = sorted(p.name for p in _site(tmp_path / "target").glob("foo-*.dist-info"))
    assert len(infos) == 1, f"one dist-info per distribution, got {infos}"
    if change is _another_apply:
        assert infos == ["foo-3.0.dist-info"] and tree(tmp_path / "target") == after
    monkeypatch.setattr(cli, "execute", real)
    assert main(["apply", source if not saved else str(tmp_path / "m.yaml"), "--yes"]) == 0, "a fresh plan applies"
    assert sorted(p.name for p in _site(tmp_path / "target").glob("foo-*.dist-info")) == ["foo-2.0.dist-info"]


# -- 2. nothing read from a host lowers the controller's SSH settings -------------------------------

@pytest.mark.parametrize("recorded", [
    {"verify_host_keys": False},
    {"verify_host_keys": False, "known_hosts": "/dev/null"},
    {"known_hosts": "/tmp/attacker_known_hosts", "identity_file": "/tmp/attacker_key"},
    {"identity_file": "keys/id", "connect_timeout": 1},
], ids=["checking-off", "checking-off-and-empty-known-hosts", "other-files", "relative-key"])
def test_recover_takes_no_ssh_setting_from_the_recorded_recipe(pair, capsys, recorded):
    """The recipe in the source's history.jsonl is data read from that host: its ``ssh`` block,
    whatever it says, never reaches the recovery manifest; the controller's settings do."""
    from transplant.controller.manifest_file import load_manifest
    from transplant.hosts.host import LocalHost
    from transplant.core.manifest import Endpoint
    from transplant.core.hostspec import HostSpec
    from transplant.recover.rebuild import from_history

    tmp_path = pair
    assert main(["apply", str(tmp_path / "m.yaml"), "--yes", "--verify"]) == 0, capsys.readouterr().out
    history = tmp_path / "target" / ".transplant" / "history.jsonl"
    lines = [json.loads(line) for line in history.read_text().splitlines()]
    for entry in lines:
        if entry.get("event") == "started":
            entry["recipe"]["manifest"]["ssh"] = recorded  # what a hostile or stale host may hold
    history.write_text("".join(json.dumps(e) + "\n" for e in lines))
    mine = {"identity_file": str(tmp_path / "controller_key"), "known_hosts": str(tmp_path / "controller_known")}
    new = Endpoint(host=HostSpec.parse("root@127.0.0.9"), venv="/srv/new")
    recovery = from_history(LocalHost(), str(tmp_path / "target"), new, tmp_path / "state", ssh=mine)
    written = load_manifest(recovery.manifest)
    assert written.ssh.verify_host_keys is True
    assert (written.ssh.identity_file, written.ssh.known_hosts) == (mine["identity_file"], mine["known_hosts"])
    assert written.ssh.connect_timeout == 10.0
    recovery = from_history(LocalHost(), str(tmp_path / "target"), new, tmp_path / "state", ssh={})
    written = load_manifest(recovery.manifest)
    assert written.ssh.verify_host_keys is True and written.ssh.identity_file is None and written.ssh.known_hosts is None


# -- 9. validation: whole-string matches, no control characters in paths ----------------------------

@pytest.mark.parametrize("text", ["root\n@127.0.0.1", "root@127.0.0.1\n", "root@[::1\n]", "root@[::1]\n",
                                  "ro\not@127.0.0.1", "root@127.0.0.1:22\n"])
def test_a_host_with_a_trailing_or_inner_newline_is_refused(text):
    from transplant.core.hostspec import HostSpec

    with pytest.raises(ValueError):
        HostSpec.parse(text)


@pytest.mark.parametrize("venv", ["/srv/venv\n", "/srv/ve\nnv", "/srv/venv\t", "/srv/\rvenv", "/srv/venv\x7f"])
def test_a_venv_path_with_a_control_character_is_refused(pair, capsys, venv):
    tmp_path = pair
    m = tmp_path / "bad.yaml"
    m.write_text((tmp_path / "m.yaml").read_text().replace(f"venv: {tmp_path / 'target'}", f"venv: {json.dumps(venv)}"))
    before = tree(tmp_path / "target")
    assert main(["plan", str(m)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "target.venv: the path" in out and "holds a control character" in out
    assert main(["inventory", f"local:{venv}"]) == 64
    assert "holds a control character" in capsys.readouterr().out
    assert main(["recover", "--target", f"root@127.0.0.1:{venv}", "--snapshot", "x"]) == 64
    assert tree(tmp_path / "target") == before and not (tmp_path / "target" / ".transplant").exists()


# -- 10. a saved plan is applied from any folder -----------------------------------------------------

def test_a_saved_plan_made_with_a_relative_manifest_path_applies_from_another_folder(pair, capsys, monkeypatch):
    tmp_path = pair
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--detailed-exitcode", "m.yaml", "--out", "p.json"]) == 2
    assert json.loads((tmp_path / "p.json").read_text())["manifest"] == str(tmp_path / "m.yaml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    capsys.readouterr()
    assert main(["apply", str(tmp_path / "p.json"), "--yes"]) == 0, capsys.readouterr().out
    assert sorted(p.name for p in _site(tmp_path / "target").glob("foo-*.dist-info")) == ["foo-2.0.dist-info"]


# -- 11. --break-lock never breaks the lock of a holder still running on this controller ------------

@pytest.mark.parametrize("holder", ["other-process", "this-process"])
def test_break_lock_refuses_a_live_holder_on_this_controller(pair, capsys, holder):
    tmp_path = pair
    target = tmp_path / "target"
    before = tree(target)
    live = subprocess.Popen(["sleep", "120"]) if holder == "other-process" else None
    pid = live.pid if live else os.getpid()
    try:
        (target / ".transplant").mkdir(mode=0o700)
        (target / ".transplant" / "lock").write_text(json.dumps({
            "id": "20260101T000000Z-0000beef", "controller": os.uname().nodename, "pid": pid, "since": 1,
            "command": "transplant apply other.yaml"}))
        assert main(["apply", str(tmp_path / "m.yaml"), "--yes", "--break-lock"]) == 1
        out = " ".join(capsys.readouterr().out.split())
        assert "is locked by an apply still running on this controller" in out and f"pid {pid}" in out
        assert f"kill {pid}" in out and "breaks only the lock of a holder that is gone" in out
        assert json.loads((target / ".transplant" / "lock").read_text())["pid"] == pid, "the lock is intact"
        assert tree(target) == before
    finally:
        if live:
            live.kill()
            live.wait()
    if live:  # its holder is gone now: broken, and said so
        assert main(["apply", str(tmp_path / "m.yaml"), "--yes", "--break-lock"]) == 0
        assert "breaking the lock" in capsys.readouterr().out


def test_rollback_takes_break_lock_as_its_hint_says(pair, capsys):
    tmp_path = pair
    target = tmp_path / "target"
    before = tree(target)
    assert main(["apply", str(tmp_path / "m.yaml"), "--yes"]) == 0
    # a lock left by a controller on another machine (its holder cannot be checked from here)
    (target / ".transplant" / "lock").write_text(json.dumps({
        "id": "20260101T000000Z-0000beef", "controller": "another-machine", "pid": 4242, "since": 1,
        "command": "transplant apply other.yaml"}))
    capsys.readouterr()
    assert main(["rollback", str(tmp_path / "m.yaml"), "--yes"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "is locked by another apply" in out and "add --break-lock" in out
    assert main(["rollback", str(tmp_path / "m.yaml"), "--yes", "--break-lock"]) == 0
    assert "breaking the lock" in capsys.readouterr().out
    assert tree(target) == before


def test_a_saved_plan_whose_manifest_is_gone_names_the_plan(pair, capsys):
    tmp_path = pair
    target = tmp_path / "target"
    before = tree(target)
    assert main(["plan", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "p.json")]) == 0
    (tmp_path / "m.yaml").rename(tmp_path / "moved.yaml")
    capsys.readouterr()
    assert main(["apply", str(tmp_path / "p.json"), "--yes"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"{tmp_path / 'p.json'} was planned from this manifest: {tmp_path / 'm.yaml'}" in out
    assert "not found" in out and f"--out {tmp_path / 'p.json'}" in out
    assert tree(target) == before


# -- 5, 6. hostile files: one clear error, quickly, and nothing written ------------------------------

def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _folder(path: Path) -> None:
    path.mkdir()


def _device(path: Path) -> None:
    path.symlink_to("/dev/zero")  # endless bytes: read whole, it would never end


def _huge(path: Path) -> None:
    with open(path, "wb") as handle:  # sparse: no disk used
        handle.truncate(300 << 20)


def _text(content: str):
    return lambda path: path.write_text(content)


MANIFEST_INPUTS = {
    "fifo": (_fifo, "is a FIFO (named pipe), not a regular file"),
    "folder": (_folder, "is a folder, not a regular file"),
    "device": (_device, "is a device, not a regular file"),
    "huge": (_huge, "over the limit of 1048576 bytes"),
    "complex-key-list": (_text("version: 1\n? [a, b]\n: 1\n"), "a key that is a list (line 2"),
    "complex-key-map": (_text("? {a: 1}\n: 1\nversion: 1\n"), "a key that is a dict (line 1"),
    "nested": (_text("a: " + "[" * 5000 + "]" * 5000 + "\n"), "nested too deeply"),
}
PLAN_INPUTS = {
    "fifo": (_fifo, "is a FIFO (named pipe), not a regular file"),
    "folder": (_folder, "is a folder, not a regular file"),
    "device": (_device, "is a device, not a regular file"),
    "huge": (_huge, "over the limit of 268435456 bytes"),
    "nested-list": (_text("[" * 200000 + "]" * 200000), "nested too deeply"),
    "nested-object": (_text('{"a": ' * 100000 + "1" + "}" * 100000), "nested too deeply"),
}


def _run(*argv: str) -> subprocess.CompletedProcess:
    import sys

    return subprocess.run([sys.executable, "-m", "transplant", *argv], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "300"})


@pytest.mark.parametrize("kind", sorted(MANIFEST_INPUTS))
def test_a_hostile_manifest_file_is_one_clear_error(pair, kind):
    tmp_path = pair
    make, said = MANIFEST_INPUTS[kind]
    path = tmp_path / "hostile.yaml"
    make(path)
    done = _run("apply", str(path), "--yes")  # apply and plan read a manifest alike
    assert done.returncode == 1, done.stdout + done.stderr
    assert said in " ".join(done.stdout.split()) and "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "target" / ".transplant").exists()


@pytest.mark.parametrize("kind", sorted(PLAN_INPUTS))
def test_a_hostile_saved_plan_is_one_clear_error(pair, kind):
    tmp_path = pair
    make, said = PLAN_INPUTS[kind]
    path = tmp_path / "hostile.json"
    make(path)
    done = _run("apply", str(path), "--yes")
    assert done.returncode == 1, done.stdout + done.stderr
    assert said in " ".join(done.stdout.split()) and "Traceback" not in done.stdout + done.stderr
    assert not (tmp_path / "target" / ".transplant").exists()


# -- 3, 5. host keys: checking off still refuses a changed key; OpenSSH's markers are honoured ------

lab_only = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="the lab needs root")


def _key_of(lab, name: str) -> str:
    kind, blob = (lab.hosts[name].folder / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    return f"{kind} {blob}"


def _other_key(tmp_path: Path) -> str:
    path = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def _rsh_hostname(host) -> subprocess.CompletedProcess:
    import shlex

    return subprocess.run([*shlex.split(host.rsync_rsh()), f"root@{host.spec.hostname}", "hostname"],
                          capture_output=True, timeout=30)


@lab_only
@pytest.mark.parametrize("known", ["changed", "absent"])
def test_checking_off_still_refuses_a_changed_key_and_says_it_is_off(lab, ssh_options, tmp_path, capfd, known):
    from transplant.errors import HostError
    from transplant.hosts.host import HostSpec, SSHOptions
    from transplant.hosts.ssh import SSHHost

    donor = lab.hosts["donor"]
    file = tmp_path / "known_hosts"
    if known == "changed":
        file.write_text(f"[{donor.address}]:{donor.port} {_key_of(lab, 'target')}\n")
    options = SSHOptions(identity_file=ssh_options.identity_file, known_hosts=file, verify_host_keys=False)
    if known == "changed":
        with pytest.raises(HostError, match="HOST KEY CHANGED"):
            SSHHost(HostSpec.parse(donor.spec), options)
        assert "host key checking is off" in capfd.readouterr().err
        # rsync's ssh, given the same settings, refuses it too
        probe = SSHHost.__new__(SSHHost)
        probe.spec, probe.options = HostSpec.parse(donor.spec), options
        done = _rsh_hostname(probe)
        assert done.returncode != 0 and done.stdout == b""
        return
    host = SSHHost(HostSpec.parse(donor.spec), options)
    try:
        assert host.run(["hostname"]).stdout == b"donor\n"
        assert "host key checking is off (ssh.verify_host_keys: false)" in capfd.readouterr().err
        assert _rsh_hostname(host).stdout == b"donor\n", "an unknown key is accepted by rsync's ssh too"
        assert not file.exists(), "and recorded nowhere"
    finally:
        host.close()


@lab_only
@pytest.mark.parametrize("lines, refused", [
    (["@revoked * {donor}", "{plain}"], "marks @revoked"),
    (["@revoked * {other}", "{plain}"], None),
    (["@cert-authority *.example.com {other}", "{plain}"], None),
    (["# a comment", "@cert-authority [127.0.0.10]:* {other}"], "@cert-authority"),
    (["@cert-authority * {other}", "@revoked 10.9.9.9 {other}", "garbage line", "{plain}"], None),
], ids=["revoked-host-key", "revoked-other-key", "ca-for-other-hosts", "ca-only", "mixed"])
def test_known_hosts_markers_are_honoured_not_a_traceback(lab, ssh_options, tmp_path, lines, refused):
    from transplant.errors import HostError
    from transplant.hosts.host import HostSpec, SSHOptions
    from transplant.hosts.ssh import SSHHost

    donor = lab.hosts["donor"]
    words = {"donor": _key_of(lab, "donor"), "other": _other_key(tmp_path),
             "plain": f"[{donor.address}]:{donor.port} {_key_of(lab, 'donor')}"}
    file = tmp_path / "known_hosts"
    file.write_text("".join(line.format(**words) + "\n" for line in lines))
    options = SSHOptions(identity_file=ssh_options.identity_file, known_hosts=file)
    if refused:
        with pytest.raises(HostError, match=refused) as caught:
            SSHHost(HostSpec.parse(donor.spec), options)
        assert "ssh-keyscan" in (caught.value.hint or "")
        return
    host = SSHHost(HostSpec.parse(donor.spec), options)
    try:
        assert host.run(["hostname"]).stdout == b"donor\n"
        assert _rsh_hostname(host).stdout == b"donor\n", "OpenSSH under rsync reads the same file"
    finally:
        host.close()


# -- 4. a target that is the donor under another name -------------------------------------------------

def _link_venv(tmp_path: Path) -> Path:
    (tmp_path / "alias").symlink_to(tmp_path / "donor")
    return tmp_path / "alias"


def _link_parent(tmp_path: Path) -> Path:
    (tmp_path / "parent").symlink_to(tmp_path)
    return tmp_path / "parent" / "donor"


def _bind_mount(tmp_path: Path) -> Path:
    (tmp_path / "bound").mkdir()
    subprocess.run(["mount", "--bind", str(tmp_path / "donor"), str(tmp_path / "bound")], check=True)
    return tmp_path / "bound"


@pytest.mark.parametrize("alias", [_link_venv, _link_parent, _bind_mount], ids=["symlink", "parent-symlink", "bind"])
def test_a_target_that_is_the_donor_under_another_name_is_refused(pair, capsys, alias):
    tmp_path = pair
    if alias is _bind_mount and os.geteuid() != 0:
        pytest.skip("a bind mount needs root")
    target = alias(tmp_path)
    try:
        m = tmp_path / "self.yaml"
        m.write_text((tmp_path / "m.yaml").read_text().replace(str(tmp_path / "target"), str(target)))
        before = tree(tmp_path / "donor")
        for argv in (["plan", str(m)], ["apply", str(m), "--yes"]):
            assert main(argv) == 1
            out = " ".join(capsys.readouterr().out.split())
            assert "is the donor" in out and "under another name" in out and "nothing was changed" in out, out
        assert tree(tmp_path / "donor") == before
        assert not (tmp_path / "donor" / ".transplant").exists()
    finally:
        if alias is _bind_mount:
            subprocess.run(["umount", str(tmp_path / "bound")], check=False)


# -- a refused input writes nothing on the target -------------------------------------------------

def _tampered_hash(plan: dict, tmp_path: Path) -> None:
    plan["changes"][0]["copy"][-1]["hash"] = "sha256=" + "A" * 43  # hand-edited: no longer what the manifest gives


def _escaping_path(plan: dict, tmp_path: Path) -> None:
    plan["changes"][0]["remove"] = list(plan["changes"][0]["remove"]) + ["../../outside.txt"]


def _other_target(plan: dict, tmp_path: Path) -> None:
    plan["target"]["venv"] = str(tmp_path / "donor3")


@pytest.mark.parametrize("edit, flag", [(_tampered_hash, None), (_escaping_path, None), (_other_target, None),
                                        (_other_target, "--resume"), (_other_target, "--rollback")],
                         ids=["changes-edited", "path-escapes", "target-not-the-manifests", "resume-other-target",
                              "rollback-other-target"])
def test_a_refused_saved_plan_writes_nothing_on_the_target(pair, capsys, edit, flag):
    """--resume / --rollback read only the plan's target, so only that edit concerns them."""
    tmp_path = pair
    assert main(["plan", "--detailed-exitcode", str(tmp_path / "m.yaml"), "--out", str(tmp_path / "p.json")]) == 2
    plan = json.loads((tmp_path / "p.json").read_text())
    edit(plan, tmp_path)
    (tmp_path / "p.json").write_text(json.dumps(plan))
    before = tree(tmp_path / "target")
    capsys.readouterr()
    code = main(["apply", str(tmp_path / "p.json"), "--yes", *([flag] if flag else [])])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 1, out
    assert str(tmp_path / "p.json") in out or "refusing the plan" in out, out
    assert not (tmp_path / "target" / ".transplant").exists(), "nothing is written before the input is accepted"
    assert not (tmp_path / "donor3" / ".transplant").exists()
    assert tree(tmp_path / "target") == before


@pytest.mark.parametrize("flag", [None, "--rollback"])
def test_a_manifest_apply_refuses_writes_nothing_on_the_target(pair, capsys, flag):
    """A manifest whose plan is blocked (it overlays a distribution the donor lacks), and a
    --rollback with nothing to undo: refused, and the target never gets a state folder."""
    tmp_path = pair
    manifest = tmp_path / "blocked.yaml"
    manifest.write_text((tmp_path / "m.yaml").read_text().replace("overlay: [foo]", "overlay: [foo, nosuchdist]"))
    before = tree(tmp_path / "target")
    code = main(["apply", str(manifest), "--yes", *([flag] if flag else [])])
    out = " ".join(capsys.readouterr().out.split())
    assert code == (3 if flag is None else 1), out
    assert ("nosuchdist" in out) if flag is None else ("no interrupted transaction to roll back" in out), out
    assert not (tmp_path / "target" / ".transplant").exists()
    assert tree(tmp_path / "target") == before
