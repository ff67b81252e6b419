"""``transplant clone``: real venvs (a console script from a real wheel with an entry point,
two ``pip install -e`` projects, a ``.pth`` file, symlinks and hardlinks) cloned to another
path on the controller, on one SSH host and between two loopback sshd hosts; the clones'
scripts and imports run with their own interpreters."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from transplant.cli.app import main
from transplant.lab.wheels import build_wheel

SITE = "lib/python3.11/site-packages"
PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"
[project]
name = "{name}"
version = "0.1"
[tool.setuptools]
packages = ["{name}"]
"""


def _python() -> str:
    return getattr(sys, "_base_executable", sys.executable)


def build_source(run: Callable[[list[str]], None], path: Callable[[str], Path], venv: str, proj: str,
                 wheels: Path) -> None:
    """A venv at ``venv`` (as the host sees it) with: the console script ``hello`` from a wheel
    with an entry point; ``projmod`` installed with ``pip install -e`` from ``proj`` (outside the
    venv); ``inmod`` installed with ``pip install -e`` from ``<venv>/src/inproj`` (inside it);
    ``extra.pth`` naming ``<venv>/extra``; a hardlinked pair; an absolute symlink into the venv
    and a relative one. ``path`` maps a host path to the controller's."""
    wheel = build_wheel(wheels, "hello-cli", "1.0", {
        "hello_cli/__init__.py": "def main():\n    import sys\n    print('hello from', sys.prefix)\n",
        "hello_cli/data.txt": "data\n"}, entry_points="[console_scripts]\nhello = hello_cli:main\n")
    run([_python(), "-m", "venv", "--without-pip", venv])
    pip = [sys.executable, "-m", "pip", "--python", f"{venv}/bin/python", "install", "-q", "--disable-pip-version-check"]
    run([*pip, "--no-index", "--no-deps", str(wheel)])
    for name, folder in (("projmod", proj), ("inmod", f"{venv}/src/inproj")):
        (path(folder) / name).mkdir(parents=True, exist_ok=True)
        (path(folder) / name / "__init__.py").write_text(f"WHO = {name!r}\n")
        (path(folder) / "pyproject.toml").write_text(PYPROJECT.format(name=name))
        run([*pip, "--no-deps", "-e", folder])
    (path(venv) / "extra").mkdir()
    (path(venv) / "extra" / "extramod.py").write_text("Z = 3\n")
    (path(venv) / SITE / "extra.pth").write_text(f"{venv}/extra\n")
    os.link(path(venv) / SITE / "hello_cli" / "data.txt", path(venv) / SITE / "hello_cli" / "data-link.txt")
    os.link(path(venv) / "bin" / "hello", path(venv) / "bin" / "hello-again")  # a hardlinked console script
    os.symlink(f"{venv}/extra/extramod.py", path(venv) / "abs-link.py")
    os.symlink("hello_cli/data.txt", path(venv) / SITE / "rel-link.txt")


def tree_naming(root: Path, prefix: str) -> tuple[list[str], list[str]]:
    """(text files, binary files) under root whose bytes contain ``prefix`` as a whole path, symlinks
    not followed; independent of transplant's own scan."""
    import re

    pattern = re.compile(re.escape(prefix.encode()) + rb"(?![A-Za-z0-9_.-])")
    text, binary = [], []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            full = Path(folder) / name
            if full.is_symlink() or not full.is_file():
                continue
            data = full.read_bytes()
            if pattern.search(data):
                (binary if b"\0" in data else text).append(str(full.relative_to(root)))
    return sorted(text), sorted(binary)


def clone_json(*argv: str, capsys) -> tuple[int, dict]:
    code = main(["clone", *argv, "--json"])
    out = capsys.readouterr().out
    return code, json.loads(out) if out.strip() else {}


def check_clone(run: Callable[[list[str]], subprocess.CompletedProcess], path: Callable[[str], Path], src: str,
                dst: str, proj: str, source: tuple[Callable, Callable] | None = None) -> None:
    """What every clone must show, whichever host it is on (``source``: the source host's
    ``run`` and ``path`` when it is another host)."""
    src_run, src_path = source or (run, path)
    # the console script runs the clone's interpreter
    out = run([f"{dst}/bin/hello"]).stdout.decode()
    assert out.strip() == f"hello from {dst}"
    assert run([f"{dst}/bin/hello-again"]).stdout.decode().strip() == f"hello from {dst}"
    # imports with the clone's interpreter: the in-venv editable and the .pth folder resolve inside the clone
    probe = "import projmod, inmod, extramod, hello_cli, sys; print(projmod.__file__, inmod.__file__, " \
            "extramod.__file__, hello_cli.__file__, sys.prefix)"
    files = run([f"{dst}/bin/python", "-c", probe]).stdout.decode().split()
    assert files == [f"{proj}/projmod/__init__.py", f"{dst}/src/inproj/inmod/__init__.py", f"{dst}/extra/extramod.py",
                     f"{dst}/{SITE}/hello_cli/__init__.py", dst]
    # bin/activate sets the clone's prefix
    env = run(["bash", "-c", f". {dst}/bin/activate && echo $VIRTUAL_ENV && command -v python"]).stdout.decode()
    assert env.split() == [dst, f"{dst}/bin/python"]
    root = path(dst)
    text, binary = tree_naming(root, src)
    assert text == []  # no text file names the old prefix: scripts, activate*, pyvenv.cfg, RECORD, .pth, finder
    assert all(p.endswith(".pyc") for p in binary), binary
    for name in ("activate", "activate.csh", "activate.fish"):  # (Activate.ps1 finds its venv from its own path)
        assert dst in (root / "bin" / name).read_text(), name
    assert (root / "pyvenv.cfg").read_text().count(dst) == 1
    # symlinks stay symlinks: relative ones as they were, absolute ones into the venv repointed
    assert os.readlink(root / "lib64") == "lib"
    assert os.readlink(root / SITE / "rel-link.txt") == "hello_cli/data.txt"
    assert os.readlink(root / "abs-link.py") == f"{dst}/extra/extramod.py"
    # hardlinks stay hardlinks within the clone, and share nothing with the source
    data, link = root / SITE / "hello_cli" / "data.txt", root / SITE / "hello_cli" / "data-link.txt"
    assert data.stat().st_ino == link.stat().st_ino and data.stat().st_nlink == 2
    script, twin = root / "bin" / "hello", root / "bin" / "hello-again"
    assert script.stat().st_ino == twin.stat().st_ino and script.stat().st_nlink == 2
    source_data = src_path(src) / SITE / "hello_cli" / "data.txt"
    assert data.stat().st_ino != source_data.stat().st_ino
    # RECORD carries the rewritten script's new hash
    record = (root / SITE / "hello_cli-1.0.dist-info" / "RECORD").read_text()
    import base64
    import hashlib

    digest = base64.urlsafe_b64encode(hashlib.sha256((root / "bin" / "hello").read_bytes()).digest()).rstrip(b"=")
    assert f"../../../bin/hello,sha256={digest.decode()}," in record
    # editing the clone leaves the source untouched (a hardlinked file and a script)
    before = {p: (src_path(src) / p).read_bytes() for p in (f"{SITE}/hello_cli/data.txt", f"{SITE}/hello_cli/__init__.py")}
    data.write_text("edited in the clone\n")
    (root / SITE / "hello_cli" / "__init__.py").write_text("def main():\n    print('edited')\n")
    assert link.read_text() == "edited in the clone\n"
    assert {p: (src_path(src) / p).read_bytes() for p in before} == before
    assert src_run([f"{src}/bin/hello"]).stdout.decode().strip() == f"hello from {src}"


@pytest.fixture(scope="module")
def local_source(tmp_path_factory):
    base = tmp_path_factory.mktemp("clone")
    venv, proj = str(base / "src-venv"), str(base / "proj")

    def run(argv):
        return subprocess.run(argv, check=True, capture_output=True)

    build_source(run, Path, venv, proj, base / "wheels")
    return base, venv, proj


def _local_run(argv):
    return subprocess.run(argv, check=True, capture_output=True)


def test_clone_on_the_controller_relocates_everything(local_source, capsys):
    base, src, proj = local_source
    dst = str(base / "clone-a")
    (Path(src) / ".transplant").mkdir()  # the source's transplant history stays with the source
    (Path(src) / ".transplant" / "history.jsonl").write_text("{}\n")
    try:
        code, report = clone_json(f"local:{src}", f"local:{dst}", capsys=capsys)
    finally:
        shutil.rmtree(Path(src) / ".transplant")
    assert code == 0, report
    assert report["ok"] is True and report["method"] == "cp --reflink=auto"
    kinds = {e["kind"] for e in report["edited"]}
    assert {"script", "activate script", "pyvenv.cfg", ".pth file", "editable finder", "direct_url.json"} <= kinds
    assert {"path": "abs-link.py", "target": f"{dst}/extra/extramod.py"} in report["relinked"]
    assert report["leftovers"]["text"] == [] and report["leftovers"]["links"] == []
    assert not (Path(dst) / ".transplant").exists()
    check_clone(_local_run, Path, src, dst, proj)


def test_clone_refusals_change_nothing(local_source, capsys):
    base, src, _ = local_source
    busy = base / "busy"
    busy.mkdir(exist_ok=True)
    (busy / "keep.txt").write_text("mine\n")
    code = main(["clone", f"local:{src}", f"local:{busy}"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 1
    assert f"the destination local:{busy} exists and is not empty; fix: choose another path" in out
    assert "nothing was copied" in out
    assert [p.name for p in busy.iterdir()] == ["keep.txt"]
    # --replace deletes only a venv, never another folder
    assert main(["clone", f"local:{src}", f"local:{busy}", "--replace"]) == 1
    assert "--replace only deletes a venv" in " ".join(capsys.readouterr().out.split())
    assert [p.name for p in busy.iterdir()] == ["keep.txt"]
    for bad, why in ((f"{base}/x/../clone-b", "is not normalised"), (f"{src}/inner", "is inside the source"),
                     (src, "is the source itself"), (f"{base}/with space", "a character a venv path may not hold")):
        assert main(["clone", f"local:{src}", f"local:{bad}"]) == 1
        assert why in " ".join(capsys.readouterr().out.split()), bad
    assert not (base / "clone-b").exists() and not (base / "with space").exists()
    # a missing parent folder is made, as python -m venv does
    assert main(["clone", f"local:{src}", f"local:{base}/no/such/venv"]) == 0
    capsys.readouterr()
    assert (base / "no/such/venv/pyvenv.cfg").is_file()
    shutil.rmtree(base / "no")
    # a source with a transplant lock (an apply running or interrupted) is not cloned
    (Path(src) / ".transplant").mkdir()
    (Path(src) / ".transplant" / "lock").write_text("{}")
    try:
        assert main(["clone", f"local:{src}", f"local:{base}/clone-locked"]) == 1
        assert "holds a transplant lock (.transplant/lock)" in " ".join(capsys.readouterr().out.split())
        assert not (base / "clone-locked").exists()
        assert main(["clone", f"local:{src}", f"local:{base}/locked-parent/venv"]) == 1
        assert not (base / "locked-parent").exists(), "a refused clone makes no folder"
    finally:
        shutil.rmtree(Path(src) / ".transplant")
    assert main(["clone", f"local:{src}", "local:relative/venv"]) == 64
    capsys.readouterr()
    # a venv at the destination goes with --replace, and the clone is whole again
    again = base / "clone-replace"
    assert main(["clone", f"local:{src}", f"local:{again}"]) == 0
    (again / "stale.txt").write_text("old clone\n")
    assert main(["clone", f"local:{src}", f"local:{again}"]) == 1
    assert "pass --replace to delete that venv first" in " ".join(capsys.readouterr().out.split())
    assert main(["clone", f"local:{src}", f"local:{again}", "--replace"]) == 0
    assert not (again / "stale.txt").exists()
    assert subprocess.run([f"{again}/bin/hello"], capture_output=True, check=True).stdout.decode().strip() == \
        f"hello from {again}"


def test_clone_refuses_a_destination_that_reaches_the_source_through_a_symlink(local_source, capsys):
    base, src, _ = local_source
    links = base / "links"
    links.mkdir(exist_ok=True)
    (links / "alias").symlink_to(base)  # .../links/alias/src-venv is the source
    (links / "into").symlink_to(src)  # .../links/into/clone lies inside the source
    (links / "up").symlink_to(base.parent)  # .../links/up/<base> holds the source
    (base / "pyvenv.cfg").write_text("home = /usr/bin\n")  # so it would pass for a venv --replace may delete
    before = sorted(str(p.relative_to(src)) for p in Path(src).rglob("*"))
    try:
        for dest, what in ((links / "alias" / "src-venv", "is the source itself"),
                           (links / "into" / "clone", "lies inside the source"),
                           (links / "up" / base.name, "holds the source")):
            assert main(["clone", f"local:{src}", f"local:{dest}", "--replace"]) == 1, dest
            out = " ".join(capsys.readouterr().out.split())
            assert f"the destination local:{dest} {what} (its real path is" in out, out
            assert "nothing was copied" in out
    finally:
        (base / "pyvenv.cfg").unlink()
    assert sorted(str(p.relative_to(src)) for p in Path(src).rglob("*")) == before
    assert not (Path(src) / "clone").exists()
    # a folder that merely holds a file named pyvenv.cfg (no home key) is not a venv --replace deletes
    stray = base / "stray"
    stray.mkdir(exist_ok=True)
    (stray / "pyvenv.cfg").write_text("not a venv\n")
    (stray / "notes.txt").write_text("mine\n")
    assert main(["clone", f"local:{src}", f"local:{stray}", "--replace"]) == 1
    assert "--replace only deletes a venv" in " ".join(capsys.readouterr().out.split())
    assert sorted(p.name for p in stray.iterdir()) == ["notes.txt", "pyvenv.cfg"]


def test_clone_relocates_latin1_and_trampoline_scripts_and_pip_uninstalls_from_the_clone(tmp_path, capsys):
    src = tmp_path / "src"
    wheel = build_wheel(tmp_path / "wheels", "hello-cli", "1.0", {
        "hello_cli/__init__.py": "def main():\n    import sys\n    print('hello from', sys.prefix)\n"},
        entry_points="[console_scripts]\nhello = hello_cli:main\n")
    _local_run([_python(), "-m", "venv", "--without-pip", str(src)])
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "--python"]
    _local_run([*pip, f"{src}/bin/python", "install", "--no-index", "--no-deps", str(wheel)])
    latin = f"#!{src}/bin/python\n# -*- coding: latin-1 -*-\nimport sys\nprint('caf\xe9', sys.prefix)\n"
    (src / "bin" / "latin").write_bytes(latin.encode("latin-1"))
    (src / "bin" / "latin").chmod(0o755)
    near = tmp_path / "near"
    code, report = clone_json(f"local:{src}", f"local:{near}", capsys=capsys)
    assert code == 0, report
    assert report["leftovers"]["text"] == [] and not [p for p in report["leftovers"]["binary"] if "latin" in p]
    assert _local_run([str(near / "bin" / "latin")]).stdout.decode().strip() == f"caf\xe9 {near}"
    (src / "bin" / "latin").unlink()  # (pip's sh form would push its coding line past line 2)
    os.link(src / "bin" / "hello", src / "bin" / "hello-twin")  # a hardlinked console script, rewritten once
    dst = tmp_path / ("x" * 130) / "clone"  # too long for a shebang: pip's #!/bin/sh + exec form
    dst.parent.mkdir()
    code, report = clone_json(f"local:{src}", f"local:{dst}", capsys=capsys)
    assert code == 0, report
    assert (dst / "bin" / "hello-twin").stat().st_ino == (dst / "bin" / "hello").stat().st_ino
    sh_form = "#!/bin/sh\n" + "'" * 3 + f"exec' {dst}/bin/python \"$0\" \"$@\"\n' " + "'" * 3 + "\n"
    assert (dst / "bin" / "hello").read_text().startswith(sh_form)
    assert _local_run([str(dst / "bin" / "hello-twin")]).stdout.decode().strip() == f"hello from {dst}"
    assert _local_run([str(dst / "bin" / "hello")]).stdout.decode().strip() == f"hello from {dst}"
    # pip reads the clone's RECORD: uninstalling from the clone removes the clone's files, not the source's
    _local_run([*pip, f"{dst}/bin/python", "uninstall", "-y", "hello-cli"])
    assert not (dst / "bin" / "hello").exists() and not glob.glob(f"{dst}/{SITE}/hello_cli*")
    assert (src / "bin" / "hello").exists()
    assert _local_run([str(src / "bin" / "hello")]).stdout.decode().strip() == f"hello from {src}"


def test_clone_of_a_source_reached_through_a_symlink_relocates_its_real_prefix(local_source, capsys):
    base, src, proj = local_source
    alias = base / "via-link"
    if not alias.is_symlink():
        alias.symlink_to(base)
    dst = str(base / "clone-via-link")
    code, report = clone_json(f"local:{alias}/src-venv", f"local:{dst}", capsys=capsys)
    assert code == 0, report
    assert report["leftovers"]["text"] == [] and report["leftovers"]["links"] == []
    check_clone(_local_run, Path, src, dst, proj)  # the files named the real path; none does in the clone


def test_clone_lists_text_files_it_cannot_relocate(local_source, capsys):
    base, src, _ = local_source
    own = base / "src-own"
    assert main(["clone", f"local:{src}", f"local:{own}"]) == 0
    # a config file that names the venv's prefix, which no rule knows how to rewrite, and a binary one
    (own / SITE / "hello_cli" / "settings.ini").write_text(f"[paths]\ncache = {own}/cache\n")
    (own / SITE / "hello_cli" / "blob.bin").write_bytes(b"\0\1" + str(own).encode() + b"/x\0")
    capsys.readouterr()
    dst = base / "clone-leftover"
    code, report = clone_json(f"local:{own}", f"local:{dst}", capsys=capsys)
    assert code == 3
    assert report["ok"] is False
    assert report["leftovers"]["text"] == [f"{SITE}/hello_cli/settings.ini"]
    assert f"{SITE}/hello_cli/blob.bin" in report["leftovers"]["binary"]
    code = main(["clone", f"local:{own}", f"local:{base / 'clone-leftover2'}"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 3
    assert f"error: 1 text file of the clone still names {own}: {SITE}/hello_cli/settings.ini" in out
    assert f"warning: 1 binary file still contains {own}: {SITE}/hello_cli/blob.bin" in out


# -- SSH hosts ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def lab_source(lab, tmp_path_factory):
    donor = lab.hosts["donor"]
    for name in ("donor", "target"):
        lab.hosts[name].run(["rm", "-rf", "/srv/cl-src", "/srv/cl-proj", "/srv/cl-dst", "/srv/cl-same", "/srv/cl-py"])

    def run(argv):
        return donor.run(argv)

    build_source(run, donor.path, "/srv/cl-src", "/srv/cl-proj", tmp_path_factory.mktemp("clwheels"))
    # a .pth file naming a folder outside the venv that only the donor has
    donor.run(["mkdir", "-p", "/srv/cl-outside"])
    donor.path(f"/srv/cl-src/{SITE}/outside.pth").write_text("/srv/cl-outside\n")
    return lab


def _ssh_args(lab) -> list[str]:
    return ["--identity-file", str(lab.identity_file), "--known-hosts", str(lab.known_hosts)]


def test_clone_between_two_ssh_hosts(lab_source, capsys, tmp_path, monkeypatch):
    lab = lab_source
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    donor, target = lab.hosts["donor"], lab.hosts["target"]
    src, dst = f"{donor.spec}:/srv/cl-src", f"{target.spec}:/srv/cl-dst"
    # the editable source /srv/cl-proj exists on the donor only: refused before anything is copied
    assert main(["clone", src, dst, *_ssh_args(lab)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "editable installs import from /srv/cl-proj, /srv/cl-proj/projmod, which the destination lacks" in out
    assert not target.path("/srv/cl-dst").exists()
    # with the project there too (as a real second host would have it), the clone goes through the controller
    shutil.copytree(donor.path("/srv/cl-proj"), target.path("/srv/cl-proj"))
    code, report = clone_json(src, dst, *_ssh_args(lab), capsys=capsys)
    assert code == 0, report
    assert report["method"] == "rsync -aH"
    assert report["warnings"] == ["a .pth file of the venv adds /srv/cl-outside to sys.path, which the destination "
                                  "lacks; Python skips a missing folder, so what it holds will not import in the clone"]

    def run(argv):
        return target.run(argv)

    check_clone(run, target.path, "/srv/cl-src", "/srv/cl-dst", "/srv/cl-proj", source=(donor.run, donor.path))
    # the relay folder in the controller's state folder was used and is gone
    assert list((tmp_path / "state" / "relay").iterdir()) == []


def test_clone_on_one_ssh_host(lab_source, capsys):
    lab = lab_source
    donor = lab.hosts["donor"]
    code, report = clone_json(f"{donor.spec}:/srv/cl-src", f"{donor.spec}:/srv/cl-same", *_ssh_args(lab),
                              capsys=capsys)
    assert code == 0, report
    assert report["method"] == "cp --reflink=auto"
    check_clone(donor.run, donor.path, "/srv/cl-src", "/srv/cl-same", "/srv/cl-proj")


def test_clone_refuses_a_full_destination_and_removes_a_failed_copy(lab_source, capsys):
    lab = lab_source
    donor, target = lab.hosts["donor"], lab.hosts["target"]
    if not target.path("/srv/cl-proj").exists():
        shutil.copytree(donor.path("/srv/cl-proj"), target.path("/srv/cl-proj"))
    src = f"{donor.spec}:/srv/cl-src"
    target.run(["mkdir", "-p", "/srv/cl-tiny", "/srv/cl-few"])
    # 1 MiB: the space check refuses before anything is copied
    target.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", "/srv/cl-tiny"])
    # room for the bytes, but only 12 inodes: the copy itself fails (ENOSPC) half-way
    target.run(["mount", "-t", "tmpfs", "-o", "size=256m,nr_inodes=12", "tmpfs", "/srv/cl-few"])
    try:
        assert main(["clone", src, f"{target.spec}:/srv/cl-tiny/venv", *_ssh_args(lab)]) == 1
        out = " ".join(capsys.readouterr().out.split())
        assert "the destination's filesystem at /srv/cl-tiny has 1.0 MiB free; the clone needs" in out
        assert "nothing was copied" in out
        assert target.run(["ls", "-A", "/srv/cl-tiny"]).stdout == b""
        assert main(["clone", src, f"{target.spec}:/srv/cl-few/venv", *_ssh_args(lab)]) == 1
        out = " ".join(capsys.readouterr().out.split())
        assert "failed, and the partial clone was removed" in out
        assert target.run(["ls", "-A", "/srv/cl-few"]).stdout == b""
    finally:
        target.run(["umount", "/srv/cl-tiny"], check=False)
        target.run(["umount", "/srv/cl-few"], check=False)
        target.run(["rm", "-rf", "/srv/cl-tiny", "/srv/cl-few"], check=False)


def test_target_base_on_another_host(lab_source, tmp_path, capsys):
    """``target.base`` on the donor's host, cloned to the target's host by apply (rsync through the controller)."""
    lab = lab_source
    donor, target = lab.hosts["donor"], lab.hosts["target"]
    if not target.path("/srv/cl-proj").exists():
        shutil.copytree(donor.path("/srv/cl-proj"), target.path("/srv/cl-proj"))
    target.run(["rm", "-rf", "/srv/cl-based"])
    manifest = tmp_path / "based.yaml"
    manifest.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: "{donor.spec}", venv: /srv/cl-src}}
        target: {{host: "{target.spec}", venv: /srv/cl-based, base: {{host: "{donor.spec}", venv: /srv/cl-src}}}}
        ssh: {{identity_file: {lab.identity_file}, known_hosts: {lab.known_hosts}}}
        overlay: [hello-cli]
        """))
    assert main(["apply", str(manifest), "--yes"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    # the clone's RECORD carries the hashes of its own console scripts (as pip writes them at that prefix), the
    # donor's those of its prefix: RECORDs that differ only in relocated scripts' rows are the same, so the
    # overlay of the same version has nothing left to write
    assert "with rsync -aH" in out and "same version, all 11 files identical" in out, out
    assert "nothing to change" in out
    assert target.run(["/srv/cl-based/bin/hello"]).stdout.decode().strip() == "hello from /srv/cl-based"
    assert not list(target.path("/srv/cl-based/.transplant/txn").glob("*/plan.json"))
    assert main(["apply", str(manifest), "--yes"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "cloning" not in out and "nothing to change" in out


def _other_python() -> str | None:
    """A real CPython of another major.minor than the one running the tests (3.9+), or None."""
    for candidate in sorted(glob.glob("/root/.pyenv/versions/*/bin/python3.*") + glob.glob("/usr/bin/python3.*")
                            + glob.glob("/usr/local/bin/python3.*")):
        if not candidate.rsplit("python", 1)[1].replace(".", "").isdigit():
            continue
        done = subprocess.run([candidate, "-c", "import sys; print(sys.version_info[:2] >= (3, 9), "
                                                "sys.version_info[:2] != (3, 11))"], capture_output=True)
        if done.returncode == 0 and done.stdout.split() == [b"True", b"True"]:
            return candidate
    return None


def test_clone_refuses_a_missing_home_or_another_python(lab_source, capsys):
    lab = lab_source
    donor, target = lab.hosts["donor"], lab.hosts["target"]
    other = _other_python()
    if other is None:
        pytest.skip("no second CPython (3.9+, not 3.11) on this machine to stand at the destination's home")
    # a venv whose home is a folder private to the donor: /srv/cl-py/bin/python3.11 -> the real 3.11
    donor.run(["mkdir", "-p", "/srv/cl-py/bin"])
    donor.run(["ln", "-s", os.path.realpath(_python()), "/srv/cl-py/bin/python3.11"])
    donor.run(["/srv/cl-py/bin/python3.11", "-m", "venv", "--without-pip", "/srv/cl-homed"])
    assert "home = /srv/cl-py/bin" in donor.path("/srv/cl-homed/pyvenv.cfg").read_text()
    src, dst = f"{donor.spec}:/srv/cl-homed", f"{target.spec}:/srv/cl-homed-clone"
    assert main(["clone", src, dst, *_ssh_args(lab)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert f"pyvenv.cfg's home /srv/cl-py/bin has no Python on the destination {dst}" in out
    assert "nothing was copied" in out
    assert not target.path("/srv/cl-homed-clone").exists()
    # the same home on the target holds another Python
    target.run(["mkdir", "-p", "/srv/cl-py/bin"])
    target.run(["ln", "-s", other, "/srv/cl-py/bin/python3.11"])
    try:
        assert main(["clone", src, dst, *_ssh_args(lab)]) == 1
        out = " ".join(capsys.readouterr().out.split())
        assert "the destination's Python at /srv/cl-py/bin is cpython 3." in out
        assert "the source venv runs cpython 3.11." in out
        assert not target.path("/srv/cl-homed-clone").exists()
    finally:
        target.run(["rm", "-rf", "/srv/cl-py"])


# -- target.base -------------------------------------------------------------------------------------------------


def test_manifest_target_base_clones_then_overlays(tmp_path, capsys):
    wheels = tmp_path / "wheels"
    new = build_wheel(wheels, "alpha", "2.0", {"alpha/__init__.py": "V = 2\n"})
    old = build_wheel(wheels / "old", "alpha", "1.0", {"alpha/__init__.py": "V = 1\n"})
    cli = build_wheel(wheels, "hello-cli", "1.0", {"hello_cli/__init__.py": "def main():\n    import sys\n"
                                                   "    print('hello from', sys.prefix)\n"},
                      entry_points="[console_scripts]\nhello = hello_cli:main\n")
    donor, base, target = tmp_path / "donor", tmp_path / "base", tmp_path / "target"
    for venv, dists in ((donor, [new]), (base, [old, cli])):
        _local_run([_python(), "-m", "venv", "--without-pip", str(venv)])
        _local_run([sys.executable, "-m", "pip", "--python", f"{venv}/bin/python", "install", "-q", "--no-index",
                    "--no-deps", "--disable-pip-version-check", *map(str, dists)])
    manifest = tmp_path / "m.yaml"
    manifest.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: local, venv: {donor}}}
        target: {{host: local, venv: {target}, base: {base}}}
        overlay: [alpha]
        """))
    # plan: says the clone comes first, plans against the base, and writes nothing
    assert main(["plan", "--detailed-exitcode", str(manifest)]) == 2
    out = " ".join(capsys.readouterr().out.split())
    assert f"target.base: local:{target} does not exist; apply first clones local:{base} to it" in out
    assert "upgrade" in out and not target.exists()
    assert main(["plan", str(manifest), "--out", str(tmp_path / "plan.json")]) == 1
    assert "a saved plan would not match it after the clone" in " ".join(capsys.readouterr().out.split())
    assert not (tmp_path / "plan.json").exists()
    # apply: clone, then the overlay on the clone; the base keeps its alpha 1.0
    assert main(["apply", str(manifest), "--yes"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert f"cloning local:{base} to it first" in out and "applied" in out
    check = "import alpha, hello_cli, sys; print(alpha.V, alpha.__file__.startswith(sys.prefix))"
    assert _local_run([f"{target}/bin/python", "-c", check]).stdout.split() == [b"2", b"True"]
    assert _local_run([f"{base}/bin/python", "-c", check]).stdout.split() == [b"1", b"True"]
    assert _local_run([f"{target}/bin/hello"]).stdout.decode().strip() == f"hello from {target}"
    # only transplant's own history names the base: apply records its manifest there (the recipe)
    assert tree_naming(target, str(base))[0] == [".transplant/history.jsonl"]
    # the target exists now: the base is not cloned again, and nothing is left to change
    assert main(["apply", str(manifest), "--yes"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "cloning" not in out and "nothing to change" in out
    assert main(["plan", str(manifest)]) == 0
    assert "target.base" not in capsys.readouterr().out


# -- the demo's target ---------------------------------------------------------------------------------------------


@pytest.mark.demo
def test_verify_passes_on_a_clone_of_the_demo_target(lab, tmp_path, capsys):
    """The demo's real target venv (torch 2.13.0 CPU, sglang 0.5.9, flashinfer; 1.9 GB) cloned on one
    loopback host; ``transplant verify`` with the clone as target and its source as the reference."""
    from transplant.cli.commands import demo
    from transplant.lab import Lab

    srv = demo.build_demo_venv("target", demo._cache_root())
    with Lab(tmp_path / "lab", ("clonedemo",)) as own:
        host = own.hosts["clonedemo"]
        subprocess.run(["cp", "-al", str(srv / "venv_sglang"), str(host.path(demo.VENV))], check=True)
        spec = host.spec
        code, report = clone_json(f"{spec}:{demo.VENV}", f"{spec}:/srv/venv_clone", *_ssh_args(own), capsys=capsys)
        assert code == 0, report
        assert report["leftovers"]["text"] == [] and report["leftovers"]["links"] == []
        assert any(e["path"].startswith("bin/torchrun") for e in report["edited"])
        manifest = tmp_path / "verify.yaml"
        manifest.write_text(textwrap.dedent(f"""\
            version: 1
            donor: {{host: "{spec}", venv: {demo.VENV}}}
            target: {{host: "{spec}", venv: /srv/venv_clone}}
            ssh: {{identity_file: {own.identity_file}, known_hosts: {own.known_hosts}}}
            overlay: [torch]
            verify:
              imports: [torch, sglang, flashinfer, sgl_kernel]
              smoke: {{device: cpu}}
            """))
        code = main(["verify", str(manifest), "--json"])
        result = json.loads(capsys.readouterr().out)
        assert code == 0, result
        stages = {s["name"]: s for s in result["stages"]}
        assert [stages[n]["status"] for n in ("imports", "requirements", "smoke")] == ["pass", "pass", "pass"]
        files = json.dumps(stages["imports"]["details"])
        assert "/srv/venv_clone/lib/python3.11/site-packages/torch/__init__.py" in files
        assert demo.VENV + "/" not in files
        # the source is untouched: its console scripts still run its own interpreter
        assert host.path(f"{demo.VENV}/bin/torchrun").read_text().startswith(f"#!{demo.VENV}/bin/python")


def test_clone_refuses_the_source_itself_reached_as_another_host(lab_source, capsys):
    """The controller and the donor are two host specs for one filesystem here: the donor's
    /srv is a folder of the controller's. The identity check (device and inode) still sees it."""
    lab = lab_source
    donor = lab.hosts["donor"]
    before = sorted(p.name for p in donor.path("/srv/cl-src").iterdir())
    for src, dst, what in ((f"local:{donor.path('/srv/cl-src')}", f"{donor.spec}:/srv/cl-src", "is the source itself"),
                           (f"{donor.spec}:/srv/cl-src", f"local:{donor.path('/srv/cl-src')}/inner",
                            "lies inside the source")):
        assert main(["clone", src, dst, "--replace", *_ssh_args(lab)]) == 1
        out = " ".join(capsys.readouterr().out.split())
        assert f"the destination {dst} {what} (its real path is" in out, out
    assert sorted(p.name for p in donor.path("/srv/cl-src").iterdir()) == before
