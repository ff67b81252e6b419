"""The direct SSH to SSH transfer (``transplant.hosts.direct``): the target pulls from the donor with
a one-time key authorised on the donor for that pull alone and the donor's pinned host key; the
relay when it cannot. Real loopback sshd hosts, real ssh, ssh-keygen and venvs; nothing mocked."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from transplant.errors import HostError
from transplant.hosts.direct import pin_path, route, stream_direct
from transplant.hosts.stream import UNAVAILABLE
from transplant.remote._common import record_hash
from transplant.reporting import RecordingReporter

from conftest import lab_skip_reason
from transplant.lab.hosts import LAB_AUTHORIZED_KEYS

hosts = pytest.mark.skipif(lab_skip_reason() is not None, reason=str(lab_skip_reason()))


def _python() -> str:
    return getattr(sys, "_base_executable", sys.executable)


FILES = {
    "lib/python3.11/site-packages/pkg/__init__.py": b"x = 1\n",
    "lib/python3.11/site-packages/pkg/lib name with spaces.so": os.urandom(900_000),
    "bin/tool": b"#!/bin/sh\necho tool\n",
    "empty.txt": b"",
}


def _donor_tree(lab, top: str) -> list[str]:
    for name in ("donor", "target"):
        lab.hosts[name].run(["rm", "-rf", top])
    src = lab.hosts["donor"].path(f"{top}/venv")
    for rel, data in FILES.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    (src / "lib/link").symlink_to("python3.11")
    lab.hosts["target"].run(["mkdir", "-p", f"{top}/txn/staged"])
    return [*FILES, "lib/link"]


def _agents(state: Path, lab=None) -> list[str]:
    """What a pull left: its records on the controller, and (given the lab) the pull-key lines in the
    donor's own authorized_keys (where the lab's sshd reads them)."""
    left = sorted(str(p) for p in (state / "pulls").iterdir()) if (state / "pulls").exists() else []
    if lab is not None:
        keys = lab.hosts["donor"].path(LAB_AUTHORIZED_KEYS)
        left += [line for line in (keys.read_text().splitlines() if keys.exists() else []) if "transplant-pull" in line]
    return left


@hosts
def test_direct_moves_the_files_hash_for_hash_and_leaves_no_agent(lab, lab_connect, tmp_path):
    listed = _donor_tree(lab, "/srv/direct")
    donor, target = lab_connect("donor"), lab_connect("target")
    way, reason = route(donor, target)
    assert way is not None and reason == ""
    staged = "/srv/direct/txn/staged"
    recorded = RecordingReporter()
    total = sum(len(d) for d in FILES.values())
    result = stream_direct(donor, "/srv/direct/venv", target, staged, listed, route=way, state_dir=tmp_path,
                           pin=pin_path(staged), src_python=_python(), dst_python=_python(), total=total,
                           reporter=recorded)
    assert result.how == "direct"
    dst = lab.hosts["target"].path(staged)
    for rel, data in FILES.items():
        assert (dst / rel).read_bytes() == data
        assert result.written[rel][:2] == (record_hash(data), len(data))
    assert os.readlink(dst / "lib/link") == "python3.11"
    assert total <= result.bytes <= total + 400
    pinned = lab.hosts["target"].path("/srv/direct/txn/donor-known-hosts").read_text()
    assert pinned.split()[1:3] == (lab.hosts["donor"].folder / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    assert _agents(tmp_path, lab) == []


@hosts
def test_a_wrong_pinned_key_is_refused_and_nothing_is_written(lab, lab_connect, tmp_path):
    listed = _donor_tree(lab, "/srv/direct-wrong")
    donor, target = lab_connect("donor"), lab_connect("target")
    way, _ = route(donor, target)
    other = (lab.hosts["target"].folder / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    name = way.pinned.split()[0]
    wrong = dataclasses.replace(way, pinned=f"{name} {other[0]} {other[1]}\n")  # the target's key, named as the donor
    staged = "/srv/direct-wrong/txn/staged"
    with pytest.raises(HostError) as caught:
        stream_direct(donor, "/srv/direct-wrong/venv", target, staged, listed, route=wrong, state_dir=tmp_path,
                      pin=pin_path(staged), src_python=_python(), dst_python=_python())
    assert caught.value.code == UNAVAILABLE
    assert "Host key verification failed" in caught.value.message or "host key" in caught.value.message.lower()
    assert list(lab.hosts["target"].path(staged).iterdir()) == []  # not one file came
    assert _agents(tmp_path, lab) == []


@hosts
def test_a_sender_failing_mid_stream_is_an_error_and_leaves_no_agent(lab, lab_connect, tmp_path):
    listed = _donor_tree(lab, "/srv/direct-vanish")
    donor, target = lab_connect("donor"), lab_connect("target")
    way, _ = route(donor, target)
    staged = "/srv/direct-vanish/txn/staged"
    with pytest.raises(HostError) as caught:
        stream_direct(donor, "/srv/direct-vanish/venv", target, staged, [*listed, "gone/away.py"], route=way,
                      state_dir=tmp_path, pin=pin_path(staged), src_python=_python(), dst_python=_python())
    assert caught.value.code != UNAVAILABLE  # it had started: not the relay's to retry
    assert "gone/away.py" in caught.value.message and "sending side" in caught.value.message
    assert [p for p in lab.hosts["target"].path(staged).rglob("*") if ".tp-" in p.name] == []
    assert _agents(tmp_path, lab) == []


@hosts
def test_no_direct_route_without_host_key_checking(lab, lab_connect, tmp_path):
    target = lab_connect("target")
    unchecked = lab_connect("donor", verify_host_keys=False)
    way, why = route(unchecked, target)
    assert way is None and "host key checking is off" in why
    way, why = route(lab_connect("donor"), target)  # the twin: the suite's settings
    assert way is not None and why == ""


# -- apply: which path, said in the output; the fallback when the target cannot reach the donor ----------

SITE = "lib/python3.11/site-packages"


def _install(host, venv: str, wheels: list[Path]) -> None:
    host.run(["rm", "-rf", venv])
    host.run([_python(), "-m", "venv", "--without-pip", venv])
    host.run([_python(), "-m", "pip", "--python", f"{venv}/bin/python", "install", "-q", "--no-index", "--no-deps",
              "--disable-pip-version-check", *map(str, wheels)])


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    from transplant.lab.wheels import build_wheel

    base = tmp_path_factory.mktemp("direct-wheels")
    blob = os.urandom(600_000).hex()
    return (build_wheel(base, "alpha", "2.0", {"alpha/__init__.py": "V = 2\n", "alpha/blob.txt": blob}),
            build_wheel(base / "old", "alpha", "1.0", {"alpha/__init__.py": "V = 1\n"}))


def _pair(lab, wheels, top: str, tmp_path: Path) -> str:
    _install(lab.hosts["donor"], f"{top}/donor", [wheels[0]])
    _install(lab.hosts["target"], f"{top}/target", [wheels[1]])
    manifest = tmp_path / "direct.yaml"
    manifest.write_text(f"version: 1\ndonor: {{host: \"{lab.hosts['donor'].spec}\", venv: {top}/donor}}\n"
                        f"target: {{host: \"{lab.hosts['target'].spec}\", venv: {top}/target}}\n"
                        f"ssh: {{identity_file: {lab.identity_file}, known_hosts: {lab.known_hosts}}}\n"
                        f"overlay: [alpha]\n")
    return str(manifest)


def _apply(capsys, manifest: str) -> str:
    from transplant.cli.app import main

    assert main(["apply", manifest, "--yes"]) == 0
    return " ".join(capsys.readouterr().out.split())


def _files(host, venv: str) -> dict[str, str]:
    root = host.path(f"{venv}/{SITE}/alpha")
    return {p.name: record_hash(p.read_bytes()) for p in sorted(root.iterdir()) if p.is_file()}


def _state() -> Path:
    return Path(os.environ["TRANSPLANT_STATE_DIR"])


@hosts
def test_apply_pulls_directly_and_says_so(lab, wheels, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRANSPLANT_TRANSFER", "direct")
    manifest = _pair(lab, wheels, "/srv/direct-apply", tmp_path)
    home = Path("~/.ssh/known_hosts").expanduser()
    before = home.read_bytes() if home.exists() else None
    mine = Path("~/.ssh/authorized_keys").expanduser()  # the lab's hosts share this machine's home folder
    mine_before = mine.read_bytes() if mine.exists() else None
    out = _apply(capsys, manifest)
    assert (mine.read_bytes() if mine.exists() else None) == mine_before, "the key went to the donor's own file"
    assert "directly" in out and "pulled from" in out and "nothing through the controller" in out
    assert "as TRANSPLANT_TRANSFER=direct asks" in out
    assert "a one-time key the donor authorised for this pull alone" in out
    donor, target = lab.hosts["donor"], lab.hosts["target"]
    assert _files(target, "/srv/direct-apply/target") == _files(donor, "/srv/direct-apply/donor")
    # the donor's key was pinned in the transaction's folder on the target, and nowhere else
    pins = list(target.path("/srv/direct-apply/target/.transplant").rglob("donor-known-hosts"))
    assert len(pins) == 1 and pins[0].parent.parent.name == "txn"
    donor_key = (donor.folder / "ssh_host_ed25519_key.pub").read_text().split()[1]
    assert donor_key in pins[0].read_text() and oct(pins[0].stat().st_mode & 0o777) == "0o600"
    assert (home.read_bytes() if home.exists() else None) == before  # the shared ~/.ssh untouched
    assert _agents(_state(), lab) == []


@hosts
def test_a_small_apply_relays_and_says_why(lab, wheels, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("TRANSPLANT_TRANSFER", raising=False)
    manifest = _pair(lab, wheels, "/srv/direct-small", tmp_path)
    out = _apply(capsys, manifest)
    assert "through the controller" in out and "not direct:" in out and "TRANSPLANT_TRANSFER=direct forces it" in out
    assert _files(lab.hosts["target"], "/srv/direct-small/target") == _files(lab.hosts["donor"], "/srv/direct-small/donor")


@pytest.fixture(scope="module")
def guarded(tmp_path_factory):
    """A lab of its own whose donor's sshd reads only the lab's shared authorized_keys, not the file
    transplant's host scripts are told to authorise a key in (a site whose AuthorizedKeysFile is
    elsewhere): the target cannot log in to the donor with the pull's key."""
    import shutil
    import tempfile

    from transplant.lab import Lab

    reason = lab_skip_reason()
    if reason:
        pytest.skip(reason)
    folder = Path(tempfile.mkdtemp(prefix="transplant-lab-", dir="/tmp"))
    try:
        with Lab(folder, ("donor", "target")) as running:
            host = running.hosts["donor"]
            host.stop_sshd()
            host.sshd_config.write_text(host.sshd_config.read_text().replace(f" {LAB_AUTHORIZED_KEYS}\n", "\n", 1))
            host.start_sshd()
            yield running
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@hosts
def test_a_target_that_cannot_log_in_to_the_donor_relays_and_says_why(guarded, wheels, tmp_path, capsys,
                                                                       monkeypatch):
    monkeypatch.setenv("TRANSPLANT_TRANSFER", "direct")
    manifest = _pair(guarded, wheels, "/srv/direct-guarded", tmp_path)
    out = _apply(capsys, manifest)
    assert "the direct copy could not start" in out and "relaying through the controller" in out
    assert "Permission denied" in out, out
    assert "through the controller, both legs at once" in out and "(not direct: it could not start" in out
    assert _files(guarded.hosts["target"], "/srv/direct-guarded/target") == \
        _files(guarded.hosts["donor"], "/srv/direct-guarded/donor")
    assert _agents(_state(), guarded) == [], "the key was removed from the donor though the pull never started"


@hosts
@pytest.mark.parametrize("method", ["zlib", "zstd"])
def test_a_compressed_direct_stream_is_compressed_between_donor_and_target(lab, lab_connect, tmp_path, method):
    import shutil

    if method == "zstd" and shutil.which("zstd") is None:
        pytest.skip("no zstd program on this machine (the lab hosts share its /usr)")
    top = f"/srv/direct-{method}"
    listed = _donor_tree(lab, top)
    lab.hosts["donor"].path(f"{top}/venv/text.txt").write_bytes(b"compressible " * 100_000)
    donor, target = lab_connect("donor"), lab_connect("target")
    way, _ = route(donor, target)
    staged = f"{top}/txn/staged"
    result = stream_direct(donor, f"{top}/venv", target, staged, [*listed, "text.txt"], route=way, state_dir=tmp_path,
                           pin=pin_path(staged), src_python=_python(), dst_python=_python(), compress=method)
    assert result.how == "direct" and result.compression == method
    assert lab.hosts["target"].path(f"{staged}/text.txt").read_bytes() == b"compressible " * 100_000
    assert result.bytes < sum(len(d) for d in FILES.values()) + 1_300_000 // 4  # the text shrank on the wire


def _as_pull_key(lab, key: Path, listing: bytes, command: str = "id") -> subprocess.CompletedProcess[bytes]:
    """``ssh`` from here to the donor with only ``key`` (no agent, no other identity), asking for
    ``command`` with ``listing`` on its standard input."""
    import subprocess

    host = lab.hosts["donor"]
    argv = ["ssh", "-F", "/dev/null", "-T", "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o",
            "IdentityAgent=none", "-i", str(key), "-o", f"UserKnownHostsFile={lab.known_hosts}",
            "-o", "StrictHostKeyChecking=yes", "-p", str(host.port), f"root@{host.address}", command]
    return subprocess.run(argv, input=listing, capture_output=True, timeout=60)


@hosts
def test_the_one_time_key_fetches_only_the_planned_files_and_is_gone_after(lab, lab_connect, tmp_path):
    """Whoever holds the pull's key (any root process on the target) gets the planned files from the
    donor, read-only, and nothing else: no command of its own, no other file; after the pull, nothing."""
    from transplant.hosts.pullkey import OneTimeKey
    from transplant.remote._common import STREAM_MAGIC

    listed = _donor_tree(lab, "/srv/direct-key")
    planned = [p for p in listed if p != "bin/tool"]
    donor = lab_connect("donor")
    key = OneTimeKey(tmp_path, donor, _python(), "/srv/direct-key/venv", planned, "none", 600)
    secret = tmp_path / "pull-key"
    with key:
        secret.write_bytes(key.private)
        secret.chmod(0o600)
        line = [x for x in lab.hosts["donor"].path(LAB_AUTHORIZED_KEYS).read_text().splitlines() if key.id in x]
        assert len(line) == 1 and line[0].startswith('restrict,expiry-time="') and 'command="exec ' in line[0]
        listing = b"".join(p.encode() + b"\0" for p in planned)
        own = _as_pull_key(lab, secret, b"", command="id; touch /srv/direct-key/venv/written")
        assert own.returncode != 0 and b"uid=" not in own.stdout
        assert b"not the one this pull was authorised for" in own.stderr
        other = _as_pull_key(lab, secret, listing + b"bin/tool\0")  # one file more than planned
        assert other.returncode != 0 and other.stdout == b"", other.stdout[:200]
        assert b"not the one this pull was authorised for" in other.stderr
        served = _as_pull_key(lab, secret, listing)
        assert served.returncode == 0 and served.stdout.startswith(STREAM_MAGIC), served.stderr
        assert FILES["lib/python3.11/site-packages/pkg/lib name with spaces.so"] in served.stdout
        assert FILES["bin/tool"] not in served.stdout
        assert not lab.hosts["donor"].path("/srv/direct-key/venv/written").exists(), "nothing ran but the sender"
    assert _as_pull_key(lab, secret, listing).returncode == 255, "the key no longer logs in"
    assert _agents(tmp_path, lab) == []


@hosts
def test_a_pull_key_left_by_a_killed_controller_is_removed_by_the_next_pull_which_says_so(lab, lab_connect,
                                                                                          tmp_path):
    """SIGKILL of the controller (the pid this test started) while its direct pull runs leaves the key
    authorised on the donor; the next direct pull from that donor removes it and says so."""
    import signal
    import subprocess
    import time
    import textwrap

    listed = _donor_tree(lab, "/srv/direct-killed")
    lab.hosts["donor"].run(["truncate", "-s", "3G", "/srv/direct-killed/venv/huge.bin"])
    staged = "/srv/direct-killed/txn/staged"
    script = tmp_path / "pull.py"
    script.write_text(textwrap.dedent(f"""\
        import dataclasses, sys
        from pathlib import Path
        from transplant.core.hostspec import HostSpec
        from transplant.hosts.host import SSHOptions
        from transplant.hosts.connecting import connect
        from transplant.hosts.direct import pin_path, route, stream_direct
        options = SSHOptions.from_files({str(lab.identity_file)!r}, {str(lab.known_hosts)!r})
        donor = connect(HostSpec.parse({lab.hosts['donor'].spec!r}), options)
        target = connect(HostSpec.parse({lab.hosts['target'].spec!r}), options)
        way, _ = route(donor, target)
        stream_direct(donor, "/srv/direct-killed/venv", target, {staged!r}, {[*listed, "huge.bin"]!r}, route=way,
                      state_dir=Path({str(tmp_path)!r}), pin=pin_path({staged!r}), src_python={_python()!r},
                      dst_python={_python()!r})
        """))
    keys = lab.hosts["donor"].path(LAB_AUTHORIZED_KEYS)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            if keys.exists() and "transplant-pull" in keys.read_text() and \
                    lab.hosts["target"].path(f"{staged}/huge.bin").parent.exists():
                break
            time.sleep(0.05)
        time.sleep(0.5)  # the pull under way
    finally:
        proc.send_signal(signal.SIGKILL)  # only the pid started here
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read()[-2000:]
    left = [line for line in keys.read_text().splitlines() if "transplant-pull" in line]
    assert len(left) == 1 and len(list((tmp_path / "pulls").glob("*.json"))) == 1, "the killed pull's key stays"
    deadline = time.monotonic() + 30
    while _receivers(staged) and time.monotonic() < deadline:  # its receiver saw its input end and stopped
        time.sleep(0.2)

    listed = _donor_tree(lab, "/srv/direct-next")
    donor, target = lab_connect("donor"), lab_connect("target")
    way, _ = route(donor, target)
    recorded = RecordingReporter()
    staged = "/srv/direct-next/txn/staged"
    result = stream_direct(donor, "/srv/direct-next/venv", target, staged, listed, route=way, state_dir=tmp_path,
                           pin=pin_path(staged), src_python=_python(), dst_python=_python(), reporter=recorded)
    assert result.how == "direct"
    said = " ".join(" ".join(n.split()) for n in recorded.notes())
    assert "removed the one-time pull key that a transplant killed during its direct pull" in said, recorded.notes()
    assert f"pid {proc.pid}" in said and lab.hosts["donor"].spec.split("@")[-1].split(":")[0] in said
    assert _agents(tmp_path, lab) == [], "nothing of either pull is left"


def _receivers(staged: str) -> list[int]:
    """Processes on this machine (the lab hosts share it) whose command line names ``staged``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if staged.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@hosts
def test_a_direct_stream_past_its_timeout_stops_on_the_target_and_leaves_no_agent(lab, lab_connect, tmp_path):
    import time

    listed = _donor_tree(lab, "/srv/direct-slow")
    lab.hosts["donor"].run(["truncate", "-s", "3G", "/srv/direct-slow/venv/huge.bin"])
    donor, target = lab_connect("donor"), lab_connect("target")
    way, _ = route(donor, target)
    staged = "/srv/direct-slow/txn/staged"
    with pytest.raises(HostError, match="timed out"):
        stream_direct(donor, "/srv/direct-slow/venv", target, staged, [*listed, "huge.bin"], route=way,
                      state_dir=tmp_path, pin=pin_path(staged), src_python=_python(), dst_python=_python(), timeout=4)
    assert _agents(tmp_path, lab) == []
    deadline = time.monotonic() + 20
    while _receivers(staged) and time.monotonic() < deadline:  # the receiver saw its input end and stopped
        time.sleep(0.2)
    assert _receivers(staged) == []
    assert [p for p in lab.hosts["target"].path(staged).rglob("*") if ".tp-" in p.name] == []


@pytest.mark.parametrize("value, way", [("", "stream"), ("stream", "stream"), ("direct", "direct"),
                                        ("relay", "relay"), ("rsync", "rsync")])
def test_each_transfer_way_can_be_chosen(monkeypatch, value, way):
    from transplant.apply.execute import transfer_way

    monkeypatch.setenv("TRANSPLANT_TRANSFER", value)
    assert transfer_way() == way


def test_a_transfer_way_that_is_none_is_a_usage_error(monkeypatch):
    from transplant.apply.execute import transfer_way
    from transplant.errors import ApplyError

    monkeypatch.setenv("TRANSPLANT_TRANSFER", "pull")
    with pytest.raises(ApplyError) as caught:
        transfer_way()
    assert "TRANSPLANT_TRANSFER='pull'" in caught.value.message and "direct, relay or rsync" in caught.value.hint


@hosts
def test_a_donor_behind_a_jump_host_is_relayed(lab, lab_connect, tmp_path):
    donor, jump = lab.hosts["donor"], lab.hosts["target"]
    config = tmp_path / "ssh_config"
    config.write_text(f"Host {donor.address}\n  ProxyJump root@{jump.address}:{jump.port}\n")
    way, why = route(lab_connect("donor", config=config), lab_connect("target"))
    assert way is None and "ProxyJump" in why


@hosts
def test_apply_killed_during_its_direct_pull_leaves_a_key_the_next_apply_removes_and_says_so(lab, wheels, tmp_path,
                                                                                             capsys, monkeypatch):
    """``transplant apply`` SIGKILLed (by the pid this test started) while the target pulls: its
    one-time key stays authorised on the donor; the next apply (``--resume``) removes it, says so,
    and applies."""
    import base64
    import hashlib
    import signal
    import subprocess
    import time

    from transplant.cli.app import main

    monkeypatch.setenv("TRANSPLANT_TRANSFER", "direct")
    top = "/srv/direct-killed-apply"
    manifest = _pair(lab, wheels, top, tmp_path)
    donor = lab.hosts["donor"]
    site = donor.path(f"{top}/donor/{SITE}")
    size = 1 << 30
    donor.run(["truncate", "-s", str(size), f"{top}/donor/{SITE}/alpha/huge.bin"])  # a GiB the pull takes seconds on
    digest = hashlib.sha256()
    zeros = bytes(1 << 20)
    for _ in range(size >> 20):
        digest.update(zeros)
    record = next(site.glob("alpha-2.0.dist-info")) / "RECORD"
    row = f"alpha/huge.bin,sha256={base64.urlsafe_b64encode(digest.digest()).rstrip(b'=').decode()},{size}\n"
    record.write_text(record.read_text() + row)
    keys = donor.path(LAB_AUTHORIZED_KEYS)
    proc = subprocess.Popen([sys.executable, "-m", "transplant", "apply", manifest, "--yes"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if keys.exists() and "transplant-pull" in keys.read_text():
                break
            time.sleep(0.02)
        time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGKILL)  # only the pid started here
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert [line for line in keys.read_text().splitlines() if "transplant-pull" in line], "its key stayed"
    time.sleep(2)  # the target's receiver sees its input end and stops
    code = main(["apply", manifest, "--resume", "--yes"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0, out
    assert "removed the one-time pull key that a transplant killed during its direct pull" in out, out
    assert f"pid {proc.pid}" in out
    assert _agents(_state(), lab) == [], "nothing of either pull is left"
    assert _files(lab.hosts["target"], f"{top}/target") == _files(donor, f"{top}/donor")
