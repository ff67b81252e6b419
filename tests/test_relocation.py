"""Cloning's pure core (what to rewrite, what is left, whether a clone may start), the host
script's prefix matching run for real in a subprocess, and ``target.base`` validation."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from transplant import remote
from transplant.errors import ManifestError
from transplant.core.manifest import parse_manifest
from transplant.core.relocation import (missing_parents, Leftovers, check_clone_paths, check_venv_path, decide, outside_venv, judge,
                                   preflight, relocatable_kind)

OLD, NEW = "/srv/venv", "/opt/clones/venv-b"


@pytest.mark.parametrize("path,why", [
    ("venv", "'venv' is not an absolute path"),
    ("/srv/../venv", "'/srv/../venv' is not normalised; write '/venv'"),
    ("/srv/venv/", "'/srv/venv/' is not normalised; write '/srv/venv'"),
    ("//srv/venv", "'//srv/venv' is not normalised"),
    ("/", "'/' cannot be a venv"),
    ("/srv/my venv", "'/srv/my venv' has a character a venv path may not hold here"),
    ("/srv/$HOME", "has a character a venv path may not hold here"),
    ("/srv/a:b", "has a character a venv path may not hold here"),  # it would split PATH in bin/activate
])
def test_clone_paths_must_be_plain_absolute_paths(path, why):
    with pytest.raises(ValueError) as info:
        check_venv_path(path, "the destination venv")
    assert str(info.value).startswith("the destination venv: ") and why in str(info.value)


def test_clone_paths_may_not_overlap_on_one_host():
    assert check_venv_path("/srv/venv_base-2.1+cu130", "x") == "/srv/venv_base-2.1+cu130"
    with pytest.raises(ValueError, match="is inside the source"):
        check_clone_paths("/srv/v", "/srv/v/clone", same_host=True)
    with pytest.raises(ValueError, match="is inside the destination"):
        check_clone_paths("/srv/v/inner", "/srv/v", same_host=True)
    with pytest.raises(ValueError, match="is the source itself"):
        check_clone_paths("/srv/v", "/srv/v", same_host=True)
    check_clone_paths("/srv/v", "/srv/v2", same_host=True)  # a sibling whose name starts alike
    check_clone_paths("/srv/v", "/srv/v", same_host=False)  # the same path on another host


@pytest.mark.parametrize("path,kind", [
    ("pyvenv.cfg", "pyvenv.cfg"), ("bin/activate", "activate script"), ("bin/activate.fish", "activate script"),
    ("bin/Activate.ps1", "activate script"), ("bin/torchrun", "script"),
    ("lib/python3.11/site-packages/torch-2.13.0.dist-info/RECORD", "RECORD"),
    ("lib/python3.11/site-packages/p-1.dist-info/direct_url.json", "direct_url.json"),
    ("lib/python3.11/site-packages/__editable___p_1_finder.py", "editable finder"),
    ("lib/python3.11/site-packages/extra.pth", ".pth file"),
    ("lib/python3.11/site-packages/p.egg-link", ".egg-link file"),
    ("share/jupyter/kernels/python3/kernel.json", "Jupyter kernel.json"),
    ("lib/python3.11/site-packages/torch/__init__.py", None), ("lib/python3.11/site-packages/sub/x.pth", None),
    ("bin/sub/tool", None), ("etc/config.ini", None),
])
def test_relocatable_kinds(path, kind):
    assert relocatable_kind(path) == kind


def test_decide_rewrites_known_files_repoints_links_and_expects_the_rest():
    long_new = "/opt/" + "x" * 130 + "/venv"
    scan = {
        "hits": [
            {"path": "bin/hello", "binary": False, "head": f"#!{OLD}/bin/python\n"},
            {"path": "bin/activate", "binary": False, "head": None},
            {"path": "bin/tool.sh", "binary": False, "head": "#!/bin/bash\n"},
            {"path": "lib/python3.11/site-packages/a-1.dist-info/RECORD", "binary": False, "head": None},
            {"path": "lib/python3.11/site-packages/a/settings.ini", "binary": False, "head": None},
            {"path": "lib/python3.11/site-packages/a/__pycache__/b.cpython-311.pyc", "binary": True, "head": None},
            {"path": "lib/python3.11/site-packages/a/_c.so", "binary": True, "head": None},
        ],
        "links": [{"path": "abs", "target": f"{OLD}/lib/x"}, {"path": "odd", "target": f"/mnt/file://{OLD}"}],
    }
    plan = decide(OLD, NEW, scan)
    by_path = {e.path: e for e in plan.edits}
    assert sorted(by_path) == ["bin/activate", "bin/hello", "bin/tool.sh",
                               "lib/python3.11/site-packages/a-1.dist-info/RECORD"]
    assert by_path["bin/hello"].head_old == f"#!{OLD}/bin/python\n"
    assert by_path["bin/hello"].head_new == f"#!{NEW}/bin/python\n"
    assert by_path["bin/tool.sh"].head_new is None  # its shebang is not the venv's: only the text is rewritten
    assert [(ln.path, ln.target) for ln in plan.links] == [("abs", f"{NEW}/lib/x")]
    assert plan.expected == Leftovers(text=("lib/python3.11/site-packages/a/settings.ini",),
                                      binary=("lib/python3.11/site-packages/a/__pycache__/b.cpython-311.pyc",
                                              "lib/python3.11/site-packages/a/_c.so"), links=("odd",))
    assert plan.expected.bytecode == ("lib/python3.11/site-packages/a/__pycache__/b.cpython-311.pyc",)
    # a prefix too long for a shebang gets pip's /bin/sh + exec form, as apply writes it
    head = decide(OLD, long_new, scan).edits[1].head_new
    assert head == f"#!/bin/sh\n'''exec' {long_new}/bin/python \"$0\" \"$@\"\n' '''\n"
    request = plan.to_request(NEW)
    assert request["root"] == NEW and request["old"] == OLD and request["new"] == NEW
    assert {"path": "abs", "target": f"{NEW}/lib/x"} in request["links"]


def test_judge_sorts_what_the_clone_still_names():
    left = judge({"hits": [{"path": "z.txt", "binary": False}, {"path": "a/__pycache__/m.cpython-311.pyc",
                                                               "binary": True}], "links": [{"path": "l", "target": OLD}]})
    assert left.text == ("z.txt",) and left.links == ("l",) and left.errors
    assert not judge({"hits": [{"path": "x.so", "binary": True}], "links": []}).errors
    assert outside_venv(["/srv/venv/src/p", "/home/me/p", "/srv/venv2/p", "/home/me/p"], OLD) == \
        ["/home/me/p", "/srv/venv2/p"]


def _check(**changes):
    answer = {"implementation": "cpython", "version": "3.11.7", "executable": "/usr/bin/python3.11",
              "dest_state": "absent", "parent": "/opt", "parent_writable": True,
              "exists": {"/home/me/p": True, "/usr/bin/python3.11": True}}
    answer.update(changes)
    return answer


def _preflight(check, **changes):
    args = dict(source="local:/srv/venv", dest="h:/opt/v", dest_venv="/opt/v", pyvenv_cfg={"home": "/usr/bin", "version": "3.11.7"},
                implementation="cpython", version="3.11.7", check=check, tried=["/usr/bin/python3.11"],
                editable=["/home/me/p"], external=[{"path": "bin/python", "target": "/usr/bin/python3.11"}],
                lock=False, replace=False)
    args.update(changes)
    return preflight(**args)


def test_preflight_passes_a_good_destination_and_warns_on_another_micro_version():
    assert _preflight(_check()) == ([], [])
    problems, warnings = _preflight(_check(version="3.11.2"))
    assert problems == [] and warnings == ["the destination's Python is 3.11.2, the source's 3.11.7 (same 3.11, so "
                                           "the same ABI)"]
    assert _preflight(_check(dest_state="empty"))[0] == []
    assert _preflight(_check(dest_state="venv"), replace=True)[0] == []


def test_preflight_names_every_problem_with_its_fix():
    problems, _ = _preflight(_check(implementation="cpython", version="3.12.1", dest_state="nonempty",
                                    parent_writable=False, exists={"/home/me/p": False}), lock=True)
    assert problems == [
        "local:/srv/venv holds a transplant lock (.transplant/lock): an apply is running there or was interrupted, so "
        "its files may be half-changed; fix: wait for it, or finish it with 'transplant apply MANIFEST --resume' "
        "(or --rollback)",
        "the destination's Python at /usr/bin is cpython 3.12.1, the source venv runs cpython 3.11.7; its extension "
        "modules and site-packages folder (python3.11) need the same Python; fix: clone to a host with cpython 3.11 "
        "at /usr/bin",
        "the destination h:/opt/v exists and is not empty; fix: choose another path (--replace only deletes a venv: "
        "a folder whose pyvenv.cfg has a home key, not a home folder or a mount point)",
        "/opt on the destination is not writable, so /opt/v cannot be made there; fix: choose a writable place, or "
        "fix its permissions",
        "an editable install imports from /home/me/p, which the destination lacks; the clone's imports would fail; "
        "fix: put the source there at the same path, or reinstall the project as a regular install in the source "
        "venv (pip install --no-deps --force-reinstall SOURCE)",
        "a symlink of the venv points to bin/python -> /usr/bin/python3.11, which the destination lacks; fix: install "
        "that there, or recreate the venv's links",
    ]
    problems, _ = _preflight(None)
    assert problems == ["pyvenv.cfg's home /usr/bin has no Python on the destination h:/opt/v (tried "
                        "/usr/bin/python3.11); the clone's python would not start; fix: install Python 3.11 at "
                        "/usr/bin there, or clone to a host that has it"]
    assert _preflight(_check(parent="/"))[0] == [], "a missing parent folder is made, as python -m venv does"
    assert missing_parents("/srv/a/b/venv", "/srv") == ["/srv/a", "/srv/a/b"]
    assert missing_parents("/srv/venv", "/srv") == []
    short = _preflight(_check(free=(20 << 20)), size=8 << 20)[0]
    assert short == ["the destination's filesystem at /opt has 20.0 MiB free; the clone needs 8.0 MiB plus 16.0 MiB; "
                     "fix: free space there, or choose another filesystem"]
    assert _preflight(_check(free=(24 << 20)), size=8 << 20)[0] == []
    assert _preflight(_check(free=0, dest_state="venv"), size=8 << 20, replace=True)[0] == []  # its space comes back
    assert _preflight(_check(), pth=["/opt/extra-libs", "/home/me/p"]) == ([], [
        "a .pth file of the venv adds /opt/extra-libs to sys.path, which the destination lacks; Python skips a "
        "missing folder, so what it holds will not import in the clone"])
    assert "pass --replace to delete that venv first" in _preflight(_check(dest_state="venv"))[0][0]
    assert "is not a folder" in _preflight(_check(dest_state="not-a-folder"))[0][0]
    assert "has no pyvenv.cfg with a home" in _preflight(None, pyvenv_cfg=None)[0][0]


def _host(op, request):
    code = remote.source("relocate").decode()
    done = subprocess.run([sys.executable, "-I", "-S", "-c", code, op], input=json.dumps(request).encode(),
                          capture_output=True, check=True)
    return json.loads(done.stdout)


def _scan(root, old):
    return _host("scan", {"root": str(root), "old": old})


def test_host_scan_matches_whole_paths_only(tmp_path):
    root = tmp_path / "v"
    (root / ".transplant").mkdir(parents=True)
    old = str(root)
    files = {
        "plain.txt": f"x = {old}/lib\n", "quoted.txt": f"'{old}'\n", "url.json": f'{{"url": "file://{old}/src"}}',
        "end.txt": f"home={old}", "longer.txt": f"{old}2/lib\n", "inside.txt": f"/mnt{old}/lib\n",
        "dotted.txt": f"{old}.bak\n", "bin.so": b"\x7fELF\0" + old.encode() + b"/x\0",
        "latin1.txt": b"\xe9" + old.encode() + b"\n", ".transplant/lock": old,
    }
    for name, data in files.items():
        (root / name).write_bytes(data.encode() if isinstance(data, str) else data)
    (root / "link").symlink_to(f"{old}/plain.txt")
    (root / "python").symlink_to("/usr/bin/python3")
    report = _scan(root, old)
    hits = {h["path"]: h["binary"] for h in report["hits"]}
    assert hits == {"plain.txt": False, "quoted.txt": False, "url.json": False, "end.txt": False, "bin.so": True,
                    "latin1.txt": True}
    assert {h["path"]: h["nul"] for h in report["hits"] if h["binary"]} == {"bin.so": True, "latin1.txt": False}
    assert report["links"] == [{"path": "link", "target": f"{old}/plain.txt"}]
    assert report["external"] == [{"path": "python", "target": "/usr/bin/python3"}]
    assert report["lock"] is True and ".transplant" not in report["top"]
    assert report["files"] == len(files) - 1


def test_manifest_target_base_is_checked():
    def load(target):
        return parse_manifest({"version": 1, "donor": {"host": "local", "venv": "/srv/donor"}, "overlay": ["x"],
                               "target": target}, path="m.yaml")

    m = load({"host": "root@gpu", "venv": "/srv/new", "base": "/srv/base"})
    assert (str(m.target.base), str(m.target)) == ("root@gpu:/srv/base", "root@gpu:/srv/new")
    m = load({"host": "root@gpu", "venv": "/srv/new", "base": {"host": "local", "venv": "/srv/base"}})
    assert str(m.target.base) == "local:/srv/base"
    for target, problem in (
        ({"host": "local", "venv": "/srv/new", "base": "base"},
         "target.base: expected an absolute venv path or {host, venv}, got the string 'base'; fix: write e.g. base: "
         "/root/venv_base (on the target's host) or base: {host: root@ct129, venv: /root/venv_base}"),
        ({"host": "local", "venv": "/srv/new", "base": "/srv/new/base"},
         "target.base: the source /srv/new/base is inside the destination /srv/new; fix: clone the base to a venv "
         "path of its own, beside it"),
        ({"host": "local", "venv": "/srv/new venv", "base": "/srv/base"},
         "target.venv: '/srv/new venv' has a character a venv path may not hold here (a blank, a quote, $, a "
         "backquote, a backslash, a colon or a control character); fix: give a plain absolute path (letters, digits, "
         "._+@=,~- and /)"),
        ({"host": "local", "venv": "/srv/new", "base": 5},
         "target.base: expected an absolute venv path or {host, venv}, got a number (5); fix: write e.g. base: "
         "/root/venv_base (on the target's host) or base: {host: root@ct129, venv: /root/venv_base}"),
        ({"host": "local", "venv": "/srv/new", "base": ["/srv/b"]},
         "target.base: expected an absolute venv path or {host, venv}, got a list; fix: write e.g. base: "
         "/root/venv_base (on the target's host) or base: {host: root@ct129, venv: /root/venv_base}"),
        ({"host": "local", "venv": "/srv/new", "base": {"venv": "/srv/b"}},
         "target.base.host: missing; fix: add it: host: root@gpu-07 (or \"local\")"),
        ({"host": "local", "venv": "/srv/new", "base": {"host": "local", "venv": "/srv/b", "base": "/x"}},
         "target.base.base: unknown key; fix: remove it; allowed keys: host, venv"),
    ):
        with pytest.raises(ManifestError) as info:
            load(target)
        assert info.value.problems == [problem]
    with pytest.raises(ManifestError) as info:
        parse_manifest({"version": 1, "donor": {"host": "local", "venv": "/srv/d", "base": "/x"}, "overlay": ["x"],
                        "target": {"host": "local", "venv": "/srv/t"}}, path="m.yaml")
    assert info.value.problems[0].startswith("donor.base: unknown key")


def test_preflight_refuses_a_destination_overlapping_the_source_by_identity():
    for overlap, what in (("same", "is the source itself"), ("inside", "lies inside the source"),
                          ("contains", "holds the source")):
        problems = _preflight(_check(overlap=overlap, real="/data/v", dest_state="venv"), replace=True)[0]
        assert problems == [f"the destination h:/opt/v {what} (its real path is /data/v, symlinks resolved); "
                            f"fix: choose a path outside the source and not above it"]


def test_decide_rewrites_a_relocatable_file_that_is_not_utf8_but_has_no_nul():
    scan = {"hits": [{"path": "bin/latin", "binary": True, "nul": False, "head": f"#!{OLD}/bin/python\n"},
                     {"path": "bin/tool", "binary": True, "nul": True, "head": None},
                     {"path": "lib/python3.11/site-packages/a/notes.txt", "binary": True, "nul": False, "head": None}],
            "links": []}
    plan = decide(OLD, NEW, scan)
    assert [(e.path, e.head_new) for e in plan.edits] == [("bin/latin", f"#!{NEW}/bin/python\n")]
    assert plan.expected.binary == ("bin/tool", "lib/python3.11/site-packages/a/notes.txt")


def test_host_scan_reads_a_file_larger_than_a_block(tmp_path):
    root = tmp_path / "v"
    root.mkdir()
    old = str(root)
    big = b"x" * (9 << 20) + f" {old}/lib\n".encode() + "é".encode()  # past the 8 MiB block; é stays UTF-8
    (root / "big.txt").write_bytes(big)
    (root / "late.txt").write_bytes(b"y" * (9 << 20) + b"\xe9 " + old.encode())  # not UTF-8 only past the block
    hits = {h["path"]: (h["binary"], h["nul"]) for h in _scan(root, old)["hits"]}
    assert hits == {"big.txt": (False, False), "late.txt": (True, False)}


def test_host_scan_judges_a_name_at_a_block_seam_with_its_context(tmp_path):
    root = tmp_path / "v"
    root.mkdir()
    old = str(root)
    block, keep = 8 << 20, len(old) + 16  # the scan's block and what it keeps of the block before
    files = {
        "across.txt": b"x" * (block - 4) + f" {old}/lib\n".encode(),  # the name spans the two blocks
        "second.txt": b"x" * (block - 1) + f" {old}/lib\n".encode(),  # it starts the second block
        # the name starting where the kept bytes begin (found in the first block), then the same
        # inside a longer name there and at the second block's start: never found
        "kept.txt": b"x" * (block - keep - 1) + b" " + old.encode() + b" " * 16 + b"y" * 8,
        "long.txt": b"x" * (block - keep - 1) + b"t" + old.encode() + b" " * 16 + b"y" * 8,
        "joined.txt": b"x" * block + old.encode() + b"\n",
    }
    for name, data in files.items():
        (root / name).write_bytes(data)
    hits = {h["path"] for h in _scan(root, old)["hits"]}
    assert hits == {"across.txt", "second.txt", "kept.txt"}


def _old(path, seconds=60):
    """Give ``path`` an mtime ``seconds`` ago (older than any scan about to start)."""
    import os
    import time

    then = time.time() - seconds
    os.utime(path, (then, then))


def test_clone_scan_reads_again_only_what_the_source_scan_could_not_vouch_for(tmp_path):
    src = tmp_path / "src"
    (src / "lib").mkdir(parents=True)
    (src / "bin").mkdir()
    old = str(src)
    for i in range(5):
        (src / "lib" / f"m{i}.py").write_text(f"X = {i}\n" * 20)
    (src / "bin" / "tool").write_text(f"#!{old}/bin/python\nprint(1)\n")
    (src / "lib" / "changed.py").write_text("Y = 1\n" * 20)  # written again after the scan, before the copy
    (src / "lib" / "touched.py").write_text("Z = 1\n" * 20)  # edited in the clone after the copy
    (src / "lib" / "tiny.py").write_text("")
    for path in src.rglob("*"):
        if path.is_file():
            _old(path)
    (src / "lib" / "fresh.py").write_text("W = 1\n" * 20)  # written just now: racy, not vouched for
    scanned = _scan(src, old)
    assert [h["path"] for h in scanned["hits"]] == ["bin/tool"]
    assert scanned["read"] == 9 and len(scanned["vouched"]) == 7  # not tool (it names it) nor fresh.py
    (src / "lib" / "changed.py").write_text(f"Y = {old!r}\n" * 20)
    dst = tmp_path / "dst"
    subprocess.run(["cp", "-a", str(src), str(dst)], check=True)
    with open(dst / "lib" / "touched.py", "a") as handle:
        handle.write(f"P = {old!r}\n")
    (dst / "lib" / "planted.txt").write_text(f"{old}/lib\n")
    (dst / "lib" / "planted-old.txt").write_text(f"{old}/lib\n")
    _old(dst / "lib" / "planted-old.txt", 3600)  # a new path is read whatever its time
    edits = [{"path": "bin/tool", "head_old": f"#!{old}/bin/python\n", "head_new": f"#!{dst}/bin/python\n"}]
    done = _host("relocate", {"root": str(dst), "old": old, "new": str(dst), "edits": edits, "links": [],
                              "vouched": scanned["vouched"]})
    assert (dst / "bin" / "tool").read_text().startswith(f"#!{dst}/bin/python\n")
    hits = sorted(h["path"] for h in done["scan"]["hits"])
    assert hits == ["lib/changed.py", "lib/planted-old.txt", "lib/planted.txt", "lib/touched.py"]
    # read again: the edited script, the two files the source scan vouched for that changed since, the
    # racy one and the two planted; not read: the five untouched modules, nor the empty one
    assert done["scan"]["read"] == 6 and done["scan"]["files"] == 12
    # without the tokens every file is read, and the same is found
    again = _host("scan", {"root": str(dst), "old": old})
    assert sorted(h["path"] for h in again["hits"]) == hits and again["read"] == 11
