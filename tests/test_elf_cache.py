"""The ELF script's cache (``ElfCache`` in ``remote/elf_facts.py``), on gcc-built shared objects:
a second read opens no file whose content did not change (the script's own ``cache.read`` list
says which files it opened), a changed file gets new facts, and a donor's cache lives on the
controller (nothing written in its venv)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from transplant.hosts.elf_facts import _controller_cache_path, read_elf_facts
from transplant.hosts.host import LocalHost
from transplant.lab.wheels import make_venv

SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
ALPHA, BETA = f"{SITE}/fx/libalpha.so", f"{SITE}/fx/libbeta.so"
VENV_STORE = {"store": "venv", "racy_ns": 0}  # the objects were built just now: trust them anyway


def _build(out: Path, soname: str, body: str) -> None:
    source = out.with_suffix(".c")
    source.write_text(body)
    subprocess.run(["gcc", "-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(out), str(source)], check=True)
    source.unlink()


@pytest.fixture()
def venv(tmp_path: Path) -> Path:
    made = make_venv(tmp_path / "venv")
    fx = made / SITE / "fx"
    fx.mkdir(parents=True)
    _build(fx / "libalpha.so", "libalpha.so.1", "int alpha_fn(void) { return 1; }\n")
    _build(fx / "libbeta.so", "libbeta.so.1", "int beta_fn(void) { return 2; }\n")
    return made


def _read(venv: Path, **options):
    return read_elf_facts(LocalHost(), str(venv), [ALPHA, BETA], **options)


def test_second_read_opens_nothing_and_a_changed_file_is_read_again(venv: Path) -> None:
    first = _read(venv, elf_cache=VENV_STORE)
    assert sorted(first.cache["read"]) == [ALPHA, BETA] and first.cache["written"] is True
    assert (venv / ".transplant" / "cache" / "elf.json").is_file()
    second = _read(venv, elf_cache=VENV_STORE)
    assert second.cache["read"] == [] and second.cache["hits"] == 2 and second.cache["misses"] == 0
    assert second.files == first.files
    # other bytes (another soname): another stat key, the file is read again and its facts are new
    _build(venv / ALPHA, "libalpha.so.2", "int alpha_fn(void) { return 3; }\n")
    third = _read(venv, elf_cache=VENV_STORE)
    assert third.cache["read"] == [ALPHA]
    assert third.files[ALPHA].soname == "libalpha.so.2" and third.files[BETA] == first.files[BETA]


def test_without_the_cache_every_file_is_read_and_the_facts_are_the_same(venv: Path) -> None:
    cached = _read(venv, elf_cache=VENV_STORE)
    plain = _read(venv)
    assert sorted(plain.cache["read"]) == [ALPHA, BETA] and plain.cache["enabled"] is False
    assert plain.files == cached.files
    again = _read(venv, elf_cache=VENV_STORE)
    assert again.files == plain.files and again.cache["read"] == []


def test_keyed_by_the_content_hash_the_probe_gave(venv: Path) -> None:
    hashes = {ALPHA: "sha256=aaaa", BETA: "sha256=bbbb"}
    first = _read(venv, elf_cache=VENV_STORE, hashes=hashes)
    assert sorted(first.cache["read"]) == [ALPHA, BETA]
    os.utime(venv / BETA)  # a new mtime, the same bytes (hash): still known
    assert _read(venv, elf_cache=VENV_STORE, hashes=hashes).cache["read"] == []
    changed = _read(venv, elf_cache=VENV_STORE, hashes={**hashes, ALPHA: "sha256=cccc"})
    assert changed.cache["read"] == [ALPHA]


def test_recent_files_are_not_trusted(venv: Path) -> None:
    racy = {"store": "venv", "racy_ns": 10 ** 12}  # every file counts as written within the clock tick
    assert sorted(_read(venv, elf_cache=racy).cache["read"]) == [ALPHA, BETA]
    assert sorted(_read(venv, elf_cache=racy).cache["read"]) == [ALPHA, BETA]


def test_symbol_answers_are_kept_per_name(venv: Path) -> None:
    first = read_elf_facts(LocalHost(), str(venv), [], defined_by={ALPHA: ["alpha_fn", "nope"]},
                           elf_cache=VENV_STORE)
    assert first.defined_by == {ALPHA: ("nope",)} and first.cache["read"] == [ALPHA]
    second = read_elf_facts(LocalHost(), str(venv), [], defined_by={ALPHA: ["alpha_fn", "nope"]},
                            elf_cache=VENV_STORE)
    assert second.defined_by == first.defined_by and second.cache["read"] == []
    query = read_elf_facts(LocalHost(), str(venv), [], defined=([BETA, ALPHA], ["alpha_fn", "beta_fn"]),
                           elf_cache=VENV_STORE)
    assert query.defined == {"alpha_fn": True, "beta_fn": True} and query.cache["read"] == [BETA]
    # a name never asked of alpha: it is opened again for that name only
    new = read_elf_facts(LocalHost(), str(venv), [], defined_by={ALPHA: ["alpha_fn", "other"]}, elf_cache=VENV_STORE)
    assert new.defined_by == {ALPHA: ("other",)} and new.cache["read"] == [ALPHA]


def test_a_state_folder_leaving_the_venv_is_not_used(venv: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, venv / ".transplant")
    report = _read(venv, elf_cache=VENV_STORE)
    assert report.cache["enabled"] is False and "symlink" in report.cache["error"]
    assert list(outside.iterdir()) == []
    assert report.files[ALPHA].soname == "libalpha.so.1"


def test_a_donor_cache_lives_on_the_controller(venv: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    time.sleep(2.1)  # past the racy window: the controller store uses the default
    first = _read(venv, elf_cache="controller")
    assert sorted(first.cache["read"]) == [ALPHA, BETA]
    assert not (venv / ".transplant").exists(), "a donor is never written to"
    assert _controller_cache_path(LocalHost(), str(venv)).is_file()
    second = _read(venv, elf_cache="controller")
    assert second.cache["read"] == [] and second.files == first.files
    monkeypatch.setenv("TRANSPLANT_HASH_CACHE", "0")
    assert sorted(_read(venv, elf_cache="controller").cache["read"]) == [ALPHA, BETA]


def test_a_bad_pyelftools_still_fails_when_a_file_must_be_read(venv: Path) -> None:
    """pyelftools is imported only when a file must be opened: a run the cache answers whole
    does not need it, one that reads a file reports the import error as before."""
    from transplant.errors import HostError
    from transplant.hosts.probing import run_script

    _read(venv, elf_cache=VENV_STORE)
    broken = {"modules": {"elftools/__init__.py": ""}, "files": [ALPHA, BETA], "cache": VENV_STORE}
    answered = run_script(LocalHost(), str(venv), "elf_facts", request=broken)
    assert answered["cache"]["read"] == [] and answered["files"][ALPHA]["soname"] == "libalpha.so.1"
    with pytest.raises(HostError, match="cannot import the pyelftools sent with the request"):
        run_script(LocalHost(), str(venv), "elf_facts", request={**broken, "files": [ALPHA, f"{SITE}/fx/new.so"]})
