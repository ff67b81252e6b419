"""The probe's content-hash cache (``<venv>/.transplant/cache/hashes.json``): a second probe
reads no file whose stat key is unchanged, and a changed file is hashed again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from transplant.hosts.host import LocalHost
from transplant.lab.wheels import build_wheel, make_venv
from transplant.hosts.probing import run_script

FILES = {f"alpha/m{i}.py": f"value = {i}\n" * 50 for i in range(20)}


@pytest.fixture()
def venv(tmp_path: Path) -> Path:
    return make_venv(tmp_path / "venv", [build_wheel(tmp_path / "w", "alpha", "1.0", FILES)])


def probe(venv: Path, **options) -> dict:
    cache = {"min_bytes": 0, "racy_ns": 0, **options}
    return run_script(LocalHost(), str(venv), "probe", ["--stdin"],
                      request={"hash": ["alpha"], "hash_cache": cache})


def hashes(document: dict) -> dict[str, str]:
    (alpha,) = [d for d in document["distributions"] if d["name"] == "alpha"]
    return {e["venv_path"]: e["hash"] for e in alpha["record"] if e.get("hash")}


def test_second_probe_reuses_hashes_and_a_changed_file_is_hashed_again(venv: Path) -> None:
    first = probe(venv)
    assert first["hash_cache"]["written"] is True and first["hash_cache"]["hits"] == 0
    cache = venv / ".transplant" / "cache" / "hashes.json"
    assert cache.is_file() and (venv / ".transplant").stat().st_mode & 0o777 == 0o700
    second = probe(venv)
    assert second["hash_cache"]["misses"] == 0 and second["hash_cache"]["hits"] == len(hashes(first))
    assert hashes(second) == hashes(first)
    # same size, other bytes: the stat key (mtime_ns, ctime_ns) changes, the hash is read again
    target = next(venv.glob("lib/python*/site-packages/alpha/m3.py"))
    target.write_text(target.read_text().replace("3", "4"))
    third = probe(venv)
    assert third["hash_cache"]["misses"] == 1
    changed = {p for p in hashes(first) if hashes(first)[p] != hashes(third)[p]}
    assert changed == {str(target.relative_to(venv))}


def test_recent_files_are_not_trusted_and_small_runs_write_nothing(venv: Path) -> None:
    racy = probe(venv, racy_ns=10 ** 12)  # every file counts as written within the clock tick
    assert racy["hash_cache"]["written"] is True
    assert probe(venv)["hash_cache"]["hits"] == 0, "racily clean entries were not stored"
    other = venv.parent / "other"
    make_venv(other, [build_wheel(venv.parent / "w2", "alpha", "1.0", FILES)])
    small = probe(other, min_bytes=1 << 30)
    assert small["hash_cache"]["written"] is False and not (other / ".transplant").exists()


def test_a_state_folder_leaving_the_venv_is_not_used(venv: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, venv / ".transplant")
    document = probe(venv)
    assert document["hash_cache"]["enabled"] is False
    assert "symlink" in document["hash_cache"]["error"]
    assert list(outside.iterdir()) == []
    assert hashes(document), "the probe still hashes, without the cache"


def test_disabled_by_the_controller(venv: Path) -> None:
    document = run_script(LocalHost(), str(venv), "probe", ["--stdin"], request={"hash": ["alpha"], "hash_cache": False})
    assert document["hash_cache"] == {"enabled": False, "hits": 0, "misses": 0, "hashed_bytes": 0,
                                        "written": False}
    assert not (venv / ".transplant").exists()


def reply_probe(venv: Path, request: dict, groups: bytes = b"") -> tuple[dict, dict[str, dict]]:
    """A ``store: reply`` probe sent ``groups`` (the known groups' lines) after its request:
    its document and the groups it printed (``{name: entries}``)."""
    import json

    from transplant.hosts.probing import _document, _reply_line

    printed: list[tuple[bytes, memoryview]] = []
    line = _reply_line(LocalHost(), str(venv), "probe", ["--stdin"], request=json.dumps(request).encode() + b"\n" +
                       groups, keep=printed.extend)
    return _document("x", "probe", line), {name.decode(): json.loads(bytes(body)) for name, body in printed}


def test_a_donor_cache_lives_on_the_controller_and_nothing_is_written_to_the_donor(venv: Path, tmp_path: Path,
                                                                                    monkeypatch) -> None:
    import json

    from transplant.hosts.probing import _controller_cache_path, take_inventory

    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    host = LocalHost()
    first = take_inventory(host, str(venv), hash_patterns=["alpha"], hash_cache="controller")
    assert not (venv / ".transplant").exists(), "a donor is never written to"
    kept = _controller_cache_path(host, str(venv))
    # the files were written just now (racily clean): nothing is trusted yet, so nothing is kept
    assert not kept.exists()
    request = {"hash": ["alpha"], "hash_cache": {"store": "reply", "racy_ns": 0}}
    reply, printed = reply_probe(venv, request)
    assert set(printed) == {"alpha"} and reply["hash_cache"]["groups"] == 1
    entries = printed["alpha"]
    assert set(entries) == set(hashes(reply)) and len(entries) > len(FILES)
    line = b"alpha\t" + json.dumps(entries).encode() + b"\n"
    again, printed = reply_probe(venv, request, line)
    assert again["hash_cache"]["misses"] == 0 and again["hash_cache"]["hits"] == len(entries)
    assert printed == {} and again["hash_cache"]["groups"] == 0, "nothing changed: no group comes back"
    assert hashes(again) == hashes(reply)
    assert {e.path: e.hash for d in first.distributions if d.name == "alpha" for e in d.record or () if e.hash} \
        == hashes(again)
    assert not (venv / ".transplant").exists()


def test_a_transaction_takes_its_before_hashes_from_the_cache_while_the_stat_key_holds(venv: Path, monkeypatch):
    """``begin``'s ``before.json`` (what ``rollback`` restores and checks) takes a replaced
    file's hash from the probe's cache when the file's stat key is the entry's, instead of
    reading it again; a file whose key changed, and every file when the files to read are
    fewer bytes than the cache is worth loading for, is read."""
    import json

    from transplant.remote import applier
    from transplant.remote._common import record_hash

    first = probe(venv)
    paths = sorted(hashes(first))
    assert first["hash_cache"]["written"] is True and len(paths) >= len(FILES)
    cache = venv / ".transplant" / "cache" / "hashes.json"
    document = json.loads(cache.read_text())
    m3 = next(p for p in paths if p.endswith("alpha/m3.py"))
    document["entries"][m3][5] = "sha256=" + "A" * 43  # the stat key still holds: only the cache knows this
    cache.write_text(json.dumps(document))
    real = {p: record_hash((venv / p).read_bytes()) for p in paths}
    absent = "lib/nowhere/new.py"

    monkeypatch.setattr(applier, "_CACHE_MIN_BYTES", 0)
    before = applier._contents_before(str(venv), [*paths, absent])
    assert before[m3] == "sha256=" + "A" * 43, "the cached hash was taken unread"
    assert {p: h for p, h in before.items() if p not in (m3, absent)} == {p: h for p, h in real.items() if p != m3}
    assert before[absent] is None

    os.utime(venv / m3)  # same bytes, another stat key: read again
    assert applier._contents_before(str(venv), [m3])[m3] == real[m3]

    document["entries"][next(p for p in paths if p.endswith("alpha/m4.py"))][5] = "sha256=" + "B" * 43
    cache.write_text(json.dumps(document))
    monkeypatch.setattr(applier, "_CACHE_MIN_BYTES", 1 << 40)  # too few bytes to read: the cache is not loaded
    assert applier._contents_before(str(venv), paths) == {**real}


def test_a_cache_that_is_not_the_venvs_own_is_not_used_for_before(venv: Path, tmp_path: Path, monkeypatch):
    import json
    import shutil

    from transplant.remote import applier
    from transplant.remote._common import record_hash

    probe(venv)
    state = venv / ".transplant"
    document = json.loads((state / "cache" / "hashes.json").read_text())
    for entry in document["entries"].values():
        entry[5] = "sha256=" + "C" * 43
    outside = tmp_path / "outside"
    shutil.copytree(state, outside)
    (outside / "cache" / "hashes.json").write_text(json.dumps(document))
    shutil.rmtree(state)
    os.symlink(outside, state)  # a state folder leading out of the venv: its cache is never read
    monkeypatch.setattr(applier, "_CACHE_MIN_BYTES", 0)
    paths = sorted(document["entries"])
    assert applier._contents_before(str(venv), paths) == {p: record_hash((venv / p).read_bytes()) for p in paths}
