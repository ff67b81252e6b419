"""The probe's inputs and its ``fingerprint`` mode (the plan memo's check).

The inputs are hashed as 64-bit lstat identities (``st_dev st_ino st_size st_mtime_ns
st_ctime_ns st_mode``, no text per file): each change the memo must not miss is made for real
in a real venv, after a full probe noted its inputs, and the fingerprint must differ; its
no-change twin (the same venv, nothing touched) must give the full probe's digest.
"""

from __future__ import annotations

import os
import time
from array import array
from pathlib import Path

import pytest

from transplant.hosts.host import LocalHost
from transplant.hosts.probing import run_script
from transplant.lab.wheels import build_wheel, make_venv
from transplant.remote import probe

FILES = {"alpha/__init__.py": "x = 1\n", "alpha/sub/m.py": "y = 2\n" * 40}


@pytest.fixture
def venv(tmp_path) -> Path:
    """A venv holding ``alpha``, older than the probe's racy window (2 s) when handed over."""
    path = make_venv(tmp_path / "venv", [build_wheel(tmp_path / "w", "alpha", "1.0", FILES)])
    time.sleep(2.1)
    return path


def _site(venv: Path) -> Path:
    return next(venv.glob("lib/python*/site-packages"))


def _inputs(venv: Path) -> dict:
    doc = run_script(LocalHost(), str(venv), "probe", ["--stdin"],
                     request={"hash_cache": False, "inputs": True, "hash": ["alpha"], "compact": True})
    assert doc["inputs"]["racy"] is False, "the venv is older than the racy window"
    return doc["inputs"]


def _fingerprint(venv: Path, inputs: dict, extra: list[str] | None = None) -> dict:
    return run_script(LocalHost(), str(venv), "probe", ["--stdin"],
                      request={"fingerprint": {"paths": inputs["paths"], "extra": extra or []}})


def _same_size_and_mtime(path: Path) -> None:
    st = path.stat()
    data = path.read_bytes()
    path.write_bytes(data.replace(b"1", b"7", 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def _replaced_by_symlink(path: Path) -> None:
    path.unlink()
    os.symlink("sub/m.py", path)


CHANGES = {
    "content-same-size-and-mtime": lambda site: _same_size_and_mtime(site / "alpha" / "__init__.py"),
    "size": lambda site: (site / "alpha" / "sub" / "m.py").write_text("y = 3\n"),
    "mode": lambda site: (site / "alpha" / "sub" / "m.py").chmod(0o600),
    "removed": lambda site: (site / "alpha" / "sub" / "m.py").unlink(),
    "replaced-by-a-symlink": lambda site: _replaced_by_symlink(site / "alpha" / "__init__.py"),
    "file-added-to-site-packages": lambda site: (site / "stray.pth").write_text("import os\n"),
}


def test_nothing_changed_gives_the_full_probes_digest(venv):
    inputs = _inputs(venv)
    answer = _fingerprint(venv, inputs)
    assert answer["count"] == inputs["count"] > 10
    assert answer["inputs"] == inputs["digest"]
    assert _fingerprint(venv, inputs)["inputs"] == inputs["digest"], "asked again: the same"


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_a_change_gives_another_digest(venv, change):
    inputs = _inputs(venv)
    assert _fingerprint(venv, inputs)["inputs"] == inputs["digest"]
    CHANGES[change](_site(venv))
    assert _fingerprint(venv, inputs)["inputs"] != inputs["digest"]


def test_the_paths_are_part_of_the_digest(venv, tmp_path):
    """Another list of paths with the same identities (the same files, named through a
    symlinked folder) does not give the kept digest."""
    inputs = _inputs(venv)
    os.symlink(venv, tmp_path / "alias")
    names = probe._unpack(inputs["paths"])
    import base64
    import zlib

    aliased = [n.replace(str(venv), str(tmp_path / "alias"), 1) for n in names]
    packed = base64.b64encode(zlib.compress(("\0".join(aliased) + "\0").encode())).decode()
    assert aliased != names
    assert _fingerprint(venv, {"paths": packed})["inputs"] != inputs["digest"]


def test_extra_paths_are_stat_ed_followed_and_named(venv, tmp_path):
    outside = tmp_path / "libstdc++.so.6"
    outside.write_bytes(b"\x7fELF")
    inputs = _inputs(venv)
    before = _fingerprint(venv, inputs, [str(outside)])["extra"]
    assert _fingerprint(venv, inputs, [str(outside)])["extra"] == before, "no change: the same"
    other = tmp_path / "other"
    os.link(outside, other)  # the same inode, another name
    assert _fingerprint(venv, inputs, [str(other)])["extra"] != before
    outside.chmod(0o600)
    assert _fingerprint(venv, inputs, [str(outside)])["extra"] != before


class _Stat:
    def __init__(self, **values: int) -> None:
        for key in ("st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns", "st_mode"):
            setattr(self, f"{key}", values.get(key, 1))


def test_an_identity_outside_64_bits_is_wrapped_whole():
    """An inode above 2**63 (some network file systems) or a time before 1970 is kept whole,
    wrapped; an append that overflowed part way is taken back, so identities stay aligned."""
    big = _Stat(st_ino=(1 << 63) + 5, st_mtime_ns=-4)
    ids = array("q", [9] * 6)
    probe._append(ids, big)
    probe._append(ids, None)
    assert len(ids) == 18
    assert list(ids[6:12]) == [1, (1 << 63) + 5 - (1 << 64), 1, -4, 1, 1]
    assert list(ids[12:]) == [-1] * 6
    small = _Stat(st_ino=5)
    plain = array("q")
    probe._append(plain, small)
    assert list(plain) == [1, 5, 1, 1, 1, 1], "the fault-free twin: values as they are"


def test_names_outside_ascii_are_stat_ed_as_the_full_probe_stat_ed_them(tmp_path):
    """The fingerprint stats the packed paths' own bytes (no encoding per path): a file
    named outside ASCII (RECORD's UTF-8) and a ``.pth`` whose name is not UTF-8 at all (listed by
    the probe, read as text) give the full probe's digest while unchanged, and another one once
    that ``.pth`` is edited with its size and mtime put back."""
    files = {"beta/__init__.py": "x = 1\n", "beta/d\u00e9j\u00e0_vu.py": "y = 1\n"}
    venv = make_venv(tmp_path / "venv", [build_wheel(tmp_path / "w", "beta", "1.0", files)])
    site = _site(venv)
    stray = os.path.join(os.fsencode(site), b"stray-\xff.pth")
    with open(stray, "wb") as handle:
        handle.write(b"# 1\n")
    time.sleep(2.1)
    doc = run_script(LocalHost(), str(venv), "probe", ["--stdin"],
                     request={"hash_cache": False, "inputs": True, "hash": ["beta"], "compact": True})
    inputs = doc["inputs"]
    names = probe._unpack(inputs["paths"])
    raw = probe._unpack(inputs["paths"], raw=True)
    assert [os.fsencode(n) for n in names] == raw, "the same bytes as the text paths would pass"
    assert stray in raw and any("d\u00e9j\u00e0_vu.py" in n for n in names), names
    assert _fingerprint(venv, inputs)["inputs"] == inputs["digest"]
    _same_size_and_mtime(Path(os.fsdecode(stray)))
    assert _fingerprint(venv, inputs)["inputs"] != inputs["digest"]
