"""Lab hosts with their own Debian systems: each runs its own glibc and Python, sees its own
files, and leaves no mount behind; a venv made with the host's own Debian Python is read whole."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from transplant.cli import main
from transplant.lab.roots import RELEASES, apt_mirror
from transplant.lab.systems import SystemLab

from system_hosts import SYSTEMS, shared_python, ssh

pytestmark = pytest.mark.hosts


def test_each_host_runs_its_release_glibc_and_python(systems):
    for name, release in SYSTEMS.items():
        out = ssh(systems, name, "python3 -c 'import platform, sys; print(platform.libc_ver()[1], "
                                 "\"%d.%d\" % sys.version_info[:2])'; hostname")
        glibc, python, hostname = out.split()
        assert (glibc, python) == (RELEASES[release].glibc, RELEASES[release].python)
        assert hostname == name


def test_the_shared_python_build_runs_on_both_glibcs(systems):
    build = shared_python()
    if build is None:
        pytest.skip("this machine's Python is the system's own; no build to share between hosts")
    seen = {ssh(systems, name, f"{build}/bin/python3 -c 'import platform, ssl; print(platform.libc_ver()[1])'").strip()
            for name in ("bookworm", "trixie")}
    assert seen == {"2.36", "2.41"}


def test_a_host_change_stays_in_its_own_layer(systems):
    twin, other = systems.hosts["trixie-twin"], systems.hosts["trixie"]
    twin.install("/usr/lib/x86_64-linux-gnu/libonly-twin.so.1", b"stand-in\n")
    try:
        assert ssh(systems, "trixie-twin", "cat /usr/lib/x86_64-linux-gnu/libonly-twin.so.1") == "stand-in\n"
        assert other.run(["test", "-e", "/usr/lib/x86_64-linux-gnu/libonly-twin.so.1"], check=False).returncode == 1
        assert not (other.system_root / "usr/lib/x86_64-linux-gnu/libonly-twin.so.1").exists()
    finally:
        twin.remove("/usr/lib/x86_64-linux-gnu/libonly-twin.so.1")
    assert twin.run(["test", "-e", "/usr/lib/x86_64-linux-gnu/libonly-twin.so.1"], check=False).returncode == 1


def test_a_stopped_lab_leaves_no_mount_and_its_root_unchanged(systems):
    root = systems.hosts["bookworm"].system_root
    before = sorted(p.name for p in (root / "srv").iterdir())
    directory = Path(tempfile.mkdtemp(prefix="transplant-systems-once-", dir="/tmp"))
    with SystemLab(directory, {"solo": "bookworm"}) as lab:
        host = lab.hosts["solo"]
        host.install("/etc/written-by-test", b"x")
        host.run(["sh", "-c", "echo y > /srv/kept"])
        mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True).stdout
        assert str(directory) not in mounts  # mounted in the host's namespace only
    mounts = subprocess.run(["findmnt", "-rn", "-o", "TARGET"], capture_output=True, text=True).stdout
    assert str(directory) not in mounts
    try:
        assert (directory / "hosts/solo/srv/kept").read_text() == "y\n"
        assert (directory / "hosts/solo/upper/etc/written-by-test").exists()
        assert not (root / "etc/written-by-test").exists()
        assert sorted(p.name for p in (root / "srv").iterdir()) == before
    finally:
        # removed only with nothing mounted under it (checked just above): a recursive delete
        # would follow a bind mount into what was bound there
        shutil.rmtree(directory)


def test_apt_mirror_is_read_from_deb822_and_one_line_sources(tmp_path):
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "security.sources").write_text("Types: deb\nURIs: http://mirror.invalid/debian-security\n")
    (tmp_path / "sources.list").write_text("# comment\ndeb [arch=amd64] http://mirror.invalid/debian bookworm main\n")
    assert apt_mirror(tmp_path) == "http://mirror.invalid/debian"
    (tmp_path / "sources.list.d" / "main.sources").write_text("Types: deb\nURIs: https://other.invalid/debian/\n")
    assert apt_mirror(tmp_path) == "https://other.invalid/debian/"


@pytest.mark.parametrize("name", ["bookworm", "trixie"])
def test_a_venv_of_debians_own_python_shows_its_distributions(systems, name, capsys):
    # Debian's sysconfig picks its posix_local scheme (local/lib/pythonX.Y/dist-packages) when site
    # has not run, which no venv uses: the probe must read the venv's own scheme.
    host = systems.hosts[name]
    host.run(["rm", "-rf", "/srv/debvenv"])
    host.run(["python3", "-m", "venv", "/srv/debvenv"])
    seen = json.loads(host.run(["/srv/debvenv/bin/python", "-c", "import importlib.metadata as m, json; "
                                "print(json.dumps(sorted(d.metadata['Name'] for d in m.distributions())))"]).stdout)
    assert "pip" in seen
    code = main(["inventory", f"{host.spec}:/srv/debvenv", "--json", "--identity-file", str(systems.identity_file),
                 "--known-hosts", str(systems.known_hosts)])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    assert sorted(d["name"] for d in doc["distributions"]) == sorted(n.lower() for n in seen)
    assert doc["paths"]["purelib"] == f"lib/python{RELEASES[SYSTEMS[name]].python}/site-packages"


def test_an_inventory_that_would_be_empty_while_other_site_folders_hold_distributions_is_refused(systems, capsys):
    host = systems.hosts["bookworm"]
    host.run(["rm", "-rf", "/srv/oddvenv"])
    host.run(["python3", "-m", "venv", "--without-pip", "/srv/oddvenv"])
    host.run(["sh", "-c", "mkdir -p /srv/oddvenv/local/lib/python3.11/dist-packages/demo-1.0.dist-info && "
                          "printf 'Metadata-Version: 2.1\\nName: demo\\nVersion: 1.0\\n' > "
                          "/srv/oddvenv/local/lib/python3.11/dist-packages/demo-1.0.dist-info/METADATA"])
    code = main(["inventory", f"{host.spec}:/srv/oddvenv", "--identity-file", str(systems.identity_file),
                 "--known-hosts", str(systems.known_hosts)])
    out = " ".join(capsys.readouterr().out.split())
    assert code != 0
    assert "found no distribution in lib/python3.11/site-packages" in out
    assert "local/lib/python3.11/dist-packages (1 dist-info)" in out
    # the same venv without the stray folder is an honest empty venv
    host.run(["rm", "-rf", "/srv/oddvenv/local"])
    assert main(["inventory", f"{host.spec}:/srv/oddvenv", "--json", "--identity-file", str(systems.identity_file),
                 "--known-hosts", str(systems.known_hosts)]) == 0
    assert json.loads(capsys.readouterr().out)["distributions"] == []


def test_hosts_are_reached_by_name_through_the_labs_ssh_config(systems, tmp_path, monkeypatch, capsys):
    from transplant.lab.up import ssh_config

    config = tmp_path / "ssh_config"
    config.write_text(ssh_config(systems))
    monkeypatch.setenv("TRANSPLANT_SSH_CONFIG", str(config))
    host = systems.hosts["trixie"]
    host.run(["rm", "-rf", "/srv/byname"])
    host.run(["python3", "-m", "venv", "--without-pip", "/srv/byname"])
    assert main(["inventory", "trixie:/srv/byname", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["host"]["hostname"] == "trixie" and doc["interpreter"]["version"].startswith("3.13.")


def test_a_root_counts_as_built_only_with_todays_package_list(tmp_path):
    from transplant.lab.roots import PACKAGES, STAMP, _complete

    root = tmp_path / "bookworm"
    root.mkdir()
    assert not _complete(root, "bookworm")  # no stamp: an interrupted build
    (root / STAMP).write_text("bookworm openssh-server python3\n")
    assert not _complete(root, "bookworm")  # built with another package list: built again
    (root / STAMP).write_text(f"bookworm {' '.join(PACKAGES)}\n")
    assert _complete(root, "bookworm") and not _complete(root, "trixie")
