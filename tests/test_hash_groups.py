"""The donor's content-hash cache kept on the controller, one group per distribution
(:class:`transplant.hosts.controller_cache.HashGroups`): a request carries only the groups of
the distributions it hashes, the probe prints back only the groups that changed, and the
controller's merge drops the entry of a changed or removed file and keeps the groups of
distributions the request did not hash (another manifest's)."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import time
from pathlib import Path

import pytest

from transplant.hosts.controller_cache import HashGroups
from transplant.hosts.host import LocalHost
from transplant.hosts.probing import _controller_cache_path, take_inventory
from transplant.lab.wheels import build_wheel, make_venv

ALPHA = {f"alpha/m{i}.py": f"value = {i}\n" * 50 for i in range(6)}
BETA = {f"beta/b{i}.py": f"other = {i}\n" * 50 for i in range(4)}


@pytest.fixture()
def donor(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    venv = make_venv(tmp_path / "venv", [build_wheel(tmp_path / "w", "alpha", "1.0", ALPHA),
                                         build_wheel(tmp_path / "w", "beta", "1.0", BETA)])
    time.sleep(2.2)  # past the probe's racy window (2 s): the files' entries can be kept
    return venv


def kept(venv: Path) -> dict[str, dict[str, list]]:
    """The controller's file for ``venv``, decoded: ``{group: entries}``."""
    lines = _controller_cache_path(LocalHost(), str(venv)).read_bytes().splitlines()
    assert json.loads(lines[0]) == {"schema": "transplant.hashes/2"}
    return {name.decode(): json.loads(body) for name, _, body in (line.partition(b"\t") for line in lines[1:])}


def probe(venv: Path, patterns: list[str]) -> tuple[dict[str, str], dict]:
    """``({venv path: hash}, the probe's hash_cache report)`` of a donor probe of ``patterns``."""
    inv = take_inventory(LocalHost(), str(venv), hash_patterns=patterns, hash_cache="controller")
    hashes = {e.path: e.hash for d in inv.distributions for e in d.record or () if e.hash}
    return hashes, dict(inv.document)["hash_cache"]


def sha256(path: Path) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()


def site(venv: Path) -> Path:
    return next(venv.glob("lib/python*/site-packages"))


def test_only_the_hashed_groups_travel_and_an_unchanged_run_writes_nothing(donor: Path) -> None:
    first, report = probe(donor, ["alpha", "beta"])
    assert report["misses"] > 0 and report["groups"] == 2
    groups = kept(donor)
    assert set(groups) == {"alpha", "beta"}
    assert set(groups["alpha"]) | set(groups["beta"]) == set(first)
    assert all("/beta" not in p for p in groups["alpha"]) and all("/alpha" not in p for p in groups["beta"])
    sent, legacy = HashGroups().select(LocalHost(), str(donor), ["Alpha"])
    assert legacy is None and [line.split(b"\t")[0] for line in sent.splitlines()] == [b"alpha"]
    # the fault-free twin: nothing changed, every hash from the cache, no group back, the file untouched
    path = _controller_cache_path(LocalHost(), str(donor))
    before = path.stat().st_mtime_ns, path.read_bytes()
    again, report = probe(donor, ["alpha"])
    assert report["misses"] == 0 and report["hits"] > 0 and report["groups"] == 0
    assert again == {p: h for p, h in first.items() if p in groups["alpha"]}
    assert (path.stat().st_mtime_ns, path.read_bytes()) == before


def test_a_changed_or_removed_file_loses_its_entry_and_other_groups_are_kept(donor: Path) -> None:
    probe(donor, ["alpha", "beta"])
    groups = kept(donor)
    changed, removed = site(donor) / "alpha" / "m1.py", site(donor) / "alpha" / "m2.py"
    rel = {p: str(p.relative_to(donor)) for p in (changed, removed)}
    old = groups["alpha"][rel[changed]]
    changed.write_text(changed.read_text().replace("1", "7"))  # same size, other bytes
    removed.unlink()
    hashes, report = probe(donor, ["alpha"])  # another manifest's plan: beta is not hashed
    assert hashes[rel[changed]] == sha256(changed) != old[5], "the changed file was hashed again"
    after = kept(donor)
    assert after["alpha"].get(rel[changed]) != old, "the changed file's old entry was kept"
    assert rel[removed] not in after["alpha"], "the removed file's entry was kept"
    assert after["beta"] == groups["beta"], "the entries of a distribution not hashed were lost"
    assert {p: e for p, e in after["alpha"].items() if p not in rel.values()} == \
        {p: e for p, e in groups["alpha"].items() if p not in rel.values()}


def test_a_distribution_gone_from_the_donor_loses_its_group(donor: Path) -> None:
    probe(donor, ["alpha", "beta"])
    shutil.rmtree(site(donor) / "beta")
    shutil.rmtree(next(site(donor).glob("beta-*.dist-info")))
    _, report = probe(donor, ["alpha", "beta"])
    assert report["groups"] == 1 and set(kept(donor)) == {"alpha"}


def test_a_first_schema_file_is_read_once_and_replaced_by_groups(donor: Path) -> None:
    first, _ = probe(donor, ["alpha"])
    entries = kept(donor)["alpha"]
    path = _controller_cache_path(LocalHost(), str(donor))
    path.write_text(json.dumps({"schema": "transplant.hashes/1", "entries": entries}))
    again, report = probe(donor, ["alpha"])
    assert report["misses"] == 0 and report["hits"] == len(entries) and again == first
    assert kept(donor) == {"alpha": entries}
