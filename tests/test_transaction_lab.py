"""Transactions against failures only real hosts have: a donor whose sshd dies mid-transfer,
a target whose filesystem is full, a folder mounted read-only (loopback sshd hosts, each with
its own mount namespace)."""

from __future__ import annotations

import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from transplant.apply import txn
from transplant.cli.app import main
from transplant.hosts.host import HostSpec
from transplant.hosts.connecting import connect
from transplant.lab.wheels import build_wheel

SITE = "lib/python3.11/site-packages"
DONOR, TARGET = "/srv/tx-donor", "/srv/tx-target"


def _python() -> str:
    return getattr(sys, "_base_executable", sys.executable)


def _install(host, venv: str, wheels: list[Path]) -> None:
    host.run(["rm", "-rf", venv])
    host.run([_python(), "-m", "venv", "--without-pip", venv])
    host.run([_python(), "-m", "pip", "--python", f"{venv}/bin/python", "install", "-q", "--no-index", "--no-deps",
              "--disable-pip-version-check", *map(str, wheels)])


def snapshot(host, venv: str) -> dict[str, bytes]:
    root = host.path(venv)
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".transplant" not in p.parts and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def hosts(lab, tmp_path_factory):
    wheels = tmp_path_factory.mktemp("txwheels")
    new = build_wheel(wheels, "alpha", "2.0", {"alpha/__init__.py": "V = 2\n", "alpha/blob.bin": "small\n"})
    old = build_wheel(wheels / "old", "alpha", "1.0", {"alpha/__init__.py": "V = 1\n"})
    _install(lab.hosts["donor"], DONOR, [new])
    _install(lab.hosts["target"], TARGET, [old])
    return lab


def manifest(tmp_path: Path, lab, target: str = TARGET) -> str:
    path = tmp_path / "tx.yaml"
    path.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: "{lab.hosts['donor'].spec}", venv: {DONOR}}}
        target: {{host: "{lab.hosts['target'].spec}", venv: {target}}}
        ssh: {{identity_file: {lab.identity_file}, known_hosts: {lab.known_hosts}}}
        overlay: [alpha]
        """))
    return str(path)


def _blob(lab, size: str) -> None:
    """Make the donor's alpha/blob.bin a sparse file of ``size`` (a hand edit: record-drift, a warning)."""
    lab.hosts["donor"].run(["truncate", "-s", size, f"{DONOR}/{SITE}/alpha/blob.bin"])


def test_donor_sshd_killed_during_the_transfer(hosts, tmp_path, capsys, monkeypatch):
    # the relayed stream (the direct pull, taken for 3 GiB, starts later and has its own
    # mid-stream failure test in test_direct.py)
    monkeypatch.setenv("TRANSPLANT_TRANSFER", "relay")
    lab = hosts
    _blob(lab, "3G")
    target = lab.hosts["target"]
    before = snapshot(target, TARGET)
    staged = target.path(f"{TARGET}/.transplant/txn")
    result: dict[str, int] = {}
    runner = threading.Thread(target=lambda: result.setdefault("code", main(["apply", manifest(tmp_path, lab),
                                                                              "--yes"])))
    runner.start()
    try:
        deadline = time.monotonic() + 120
        while not (staged.exists() and any(staged.iterdir())) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)  # the stream is reading the donor now
        lab.hosts["donor"].stop_sshd()
        runner.join(300)
    finally:
        lab.hosts["donor"].start_sshd()
    out = " ".join(capsys.readouterr().out.split())
    assert result["code"] == 1, out
    assert f"stream from {lab.hosts['donor'].spec}:{DONOR}: the sending side failed" in out, out
    assert "was aborted before its commit: its staged files were discarded and the live venv did not change" in out
    assert snapshot(target, TARGET) == before, "the live venv never changed"
    ends = {t["id"]: t["state"] for t in txn.history(_target(lab), TARGET)["transactions"]}
    assert list(ends.values())[-1] == "aborted"
    _blob(lab, "0")


def _target(lab):
    from transplant.hosts.host import SSHOptions

    options = SSHOptions(identity_file=lab.identity_file, known_hosts=lab.known_hosts, connect_timeout=5.0)
    return connect(HostSpec.parse(lab.hosts["target"].spec), options)


def test_full_disk_is_refused_with_the_space_needed_and_free(hosts, tmp_path, capsys):
    lab = hosts
    target = lab.hosts["target"]
    target.run(["mkdir", "-p", "/srv/tiny"])
    target.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", "/srv/tiny"])
    try:
        old = next(Path(p) for p in (tmp_path.parent).glob("txwheels*/old/*.whl"))
        _install(target, "/srv/tiny/venv", [old])
        _blob(lab, "40M")
        before = snapshot(target, "/srv/tiny/venv")
        assert main(["apply", manifest(tmp_path, lab, "/srv/tiny/venv"), "--yes"]) == 1
        out = " ".join(capsys.readouterr().out.split())
        assert "not enough space for the transaction: it needs 56.0 MiB" in out
        assert "MiB is free; nothing was changed" in out
        assert snapshot(target, "/srv/tiny/venv") == before
    finally:
        _blob(lab, "0")
        target.run(["umount", "/srv/tiny"], check=False)


def test_read_only_folder_is_refused_before_anything_changes(hosts, tmp_path, capsys):
    lab = hosts
    target = lab.hosts["target"]
    folder = f"{TARGET}/{SITE}/alpha"
    target.run(["mount", "--bind", folder, folder])
    target.run(["mount", "-o", "remount,bind,ro", folder])
    try:
        before = snapshot(target, TARGET)
        assert main(["apply", manifest(tmp_path, lab), "--yes"]) == 1
        out = " ".join(capsys.readouterr().out.split())
        assert "cannot write 2 places in the venv:" in out and "nothing was changed" in out
        assert f"{SITE}/alpha: on a read-only filesystem" in out
        assert f"{SITE}/alpha/__pycache__: on a read-only filesystem" in out
        assert snapshot(target, TARGET) == before
    finally:
        target.run(["umount", folder], check=False)
    assert main(["apply", manifest(tmp_path, lab), "--yes"]) == 0
    assert target.path(f"{folder}/__init__.py").read_text() == "V = 2\n"
