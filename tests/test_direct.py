"""The direct SSH to SSH transfer (``transplant.hosts.direct``): the target pulls from the donor with
a scoped agent and the donor's pinned host key; the relay when it cannot. Real loopback sshd hosts,
real ssh, ssh-agent and venvs; nothing mocked."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from transplant.errors import HostError
from transplant.hosts.direct import pin_path, route, stream_direct
from transplant.hosts.stream import UNAVAILABLE
from transplant.remote._common import record_hash
from transplant.reporting import RecordingReporter

from conftest import lab_skip_reason

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


def _agents(state: Path) -> list[str]:
    return sorted(str(p) for p in (state / "agents").iterdir()) if (state / "agents").exists() else []


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
    assert _agents(tmp_path) == []
