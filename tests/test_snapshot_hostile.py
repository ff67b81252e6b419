"""Hostile inputs to snapshots, recover and fleets (no hosts): edited indexes, prune, history
recipes, fleet targets and --jobs."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time

import pytest

from transplant.donor import store as cas
from transplant.core.hostspec import HostSpec
from transplant.core.manifest import Endpoint


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


OK = {"hash": record_hash(b"ok\n"), "size": 3, "mode": 0o644}


def _index(store, sid: str, files: dict, patches: list | None = None):
    """Write a snapshot index the way capture does (with its own digest), objects for ``ok\\n``."""
    from inventory_docs import dist, document
    from transplant.donor.snapshot import SNAPSHOT_SCHEMA, _index_digest

    src = store.parent / "src"
    src.write_bytes(b"ok\n")
    cas.put(store, OK["hash"], src)
    doc = {"schema": SNAPSHOT_SCHEMA, "id": sid, "created": 0.0, "donor": {"host": "h", "venv": "/v"},
           "overlay": ["alpha"], "dists": ["alpha"],
           "inventory": document("/v", [dist("alpha", "1.0", {"alpha/x.py": "ok\n"})]),
           "files": files, "patches": patches or [], "manifest": {"data": {}, "dir": "/"}}
    doc["digest"] = _index_digest(doc)
    (store / "index").mkdir(parents=True, exist_ok=True)
    path = store / "index" / f"{sid}.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


@pytest.mark.parametrize("files, patches, problem", [
    ({"/etc/passwd": OK}, [], "leaves the venv"),
    ({"a/../../x": OK}, [], "leaves the venv"),
    ({".transplant/history.jsonl": OK}, [], "leaves the venv"),
    ({"a.py": {**OK, "hash": "sha256=../../../etc/passwd"}}, [], "not a RECORD sha256 hash"),
    ({"a.py": {**OK, "mode": "0o4755"}}, [], "mode must be a whole number"),
    ({"a.py": {"symlink": 7}}, [], "symlink target must be text"),
    ({}, [{"local": "../../.bashrc", "dest": "x.py", "hash": OK["hash"], "size": 3}], "patches[0]"),
])
def test_an_edited_index_with_a_valid_digest_is_refused_when_read(tmp_path, files, patches, problem):
    from transplant.donor.snapshot import SnapshotError, load_snapshot

    path = _index(tmp_path / "store", "bad", files, patches)
    with pytest.raises(SnapshotError, match="damaged index") as info:
        load_snapshot(str(path))
    assert problem in info.value.message and "take the snapshot again" in info.value.hint


def test_view_drops_setuid_bits(tmp_path):
    from transplant.donor.snapshot import SnapshotSource, load_snapshot

    path = _index(tmp_path / "store", "s", {"alpha/x.py": {**OK, "mode": 0o4755}})
    with SnapshotSource(load_snapshot(str(path))) as source:
        _host, root = source.files(["alpha/x.py"])
        assert (tmp_path / root / "alpha/x.py").stat().st_mode & 0o7777 == 0o755


def test_prune_keeps_everything_when_an_index_is_damaged(tmp_path):
    from transplant.donor.snapshot import SnapshotError, prune

    store = tmp_path / "store"
    _index(store, "good", {"alpha/x.py": OK})
    damaged = store / "index" / "other.json"
    damaged.write_text("{not json", encoding="utf-8")
    other = tmp_path / "o"
    other.write_bytes(b"used by the damaged one\n")
    cas.put(store, record_hash(other.read_bytes()), other)
    before = cas.object_sizes(store)
    with pytest.raises(SnapshotError, match="nothing was removed") as info:
        prune(store, ["good"])
    assert str(damaged) in info.value.hint
    assert cas.object_sizes(store) == before and (store / "index" / "good.json").exists()
    damaged.unlink()
    assert prune(store, [])[1] == 1, "the unreferenced object goes once the damaged index is moved away"


def test_prune_waits_for_a_capture_under_way(tmp_path):
    from transplant.donor.snapshot import prune

    store = tmp_path / "store"
    _index(store, "good", {"alpha/x.py": OK})
    orphan = tmp_path / "o"
    orphan.write_bytes(b"stored, index not yet written\n")
    done: list = []
    with cas.locked(store, exclusive=False):
        cas.put(store, record_hash(orphan.read_bytes()), orphan)
        worker = threading.Thread(target=lambda: done.append(prune(store, [])))
        worker.start()
        time.sleep(0.3)
        assert not done, "prune waits while a capture holds the store"
        assert cas.has(store, record_hash(orphan.read_bytes()))
    worker.join(10)
    assert done and done[0][1] == 1


def _end(host: str, venv: str, port: int | None = None, user: str | None = "root") -> Endpoint:
    return Endpoint(host=HostSpec(hostname=host, user=user, port=port), venv=venv)


@pytest.mark.parametrize("targets, donors, jobs, problem", [
    ([_end("127.0.0.2", "/v")], [], 0, "--jobs 0"),
    ([_end("127.0.0.2", "/v")], [], -3, "--jobs -3"),
    ([_end("127.0.0.2", "/v"), _end("127.0.0.2", "/v/", port=22, user=None)], [], 4, "are one venv on one host"),
    ([_end("127.0.0.2", "/v"), _end("127.0.0.3", "/srv//v/.")], [_end("127.0.0.3", "/srv/v", user="x")], 4,
     "is the donor venv"),
])
def test_fleet_refuses_duplicates_donors_and_bad_jobs(targets, donors, jobs, problem):
    from transplant.fleet.run import FleetError, check_fleet

    with pytest.raises(FleetError) as info:
        check_fleet(targets, donors, jobs)
    assert problem in info.value.message and info.value.hint


def test_fleet_workers_are_capped_by_the_targets():
    from transplant.fleet.run import check_fleet

    targets = [_end("127.0.0.2", "/v"), _end("127.0.0.2", "/w"), _end("127.0.0.3", "/v")]
    assert check_fleet(targets, [], 10**9) == 3
    assert check_fleet(targets, [], 2) == 2


def test_one_target_raising_unexpectedly_does_not_hide_the_others(monkeypatch):
    from transplant.fleet import run as fleet

    def boom(host, ssh):
        if host.hostname == "127.0.0.3":
            raise RuntimeError("wires crossed")
        raise fleet.TransplantError("cannot reach it", hint="start sshd")

    from transplant.core.manifest import parse_manifest

    monkeypatch.setattr(fleet, "connect", boom)
    manifest = parse_manifest({"version": 1, "overlay": ["alpha"], "donor": {"host": "root@127.0.0.9", "venv": "/v"},
                               "target": {"host": "root@127.0.0.2", "venv": "/v"}}, path="m.yaml")
    targets = [_end("127.0.0.2", "/v"), _end("127.0.0.3", "/v")]
    results = fleet.run_fleet("verify", manifest, targets, None, None, jobs=2)
    assert [r.code for r in results] == [1, 1]
    assert results[0].error == "cannot reach it" and "RuntimeError: wires crossed" in results[1].error


GOOD_PATCH = {"venv_path": "lib/python3.11/site-packages/alpha/x.py", "local": "patches/x.py", "hash": OK["hash"]}


@pytest.mark.parametrize("patch, problem", [
    ({**GOOD_PATCH, "venv_path": "../../../root/.ssh/id_ed25519"}, "is not a file inside the venv"),
    ({**GOOD_PATCH, "venv_path": "/etc/shadow"}, "is not a file inside the venv"),
    ({**GOOD_PATCH, "venv_path": ".transplant/history.jsonl"}, "is not a file inside the venv"),
    ({**GOOD_PATCH, "venv_path": None}, "does not say where in the venv"),
    ({**GOOD_PATCH, "local": "../../.bashrc"}, "leaves the manifest's folder"),
    ({**GOOD_PATCH, "local": "/tmp/x.py"}, "leaves the manifest's folder"),
    ({**GOOD_PATCH, "hash": ["sha256"]}, "is not a RECORD sha256 hash"),
    ("patches/x.py", "is not a file inside the venv"),
])
def test_recover_refuses_a_hostile_recipe_before_reading_anything(patch, problem):
    from transplant.recover.rebuild import RecoverError, recorded_patches

    assert recorded_patches({"patches": [GOOD_PATCH]}, "h:/v") == [GOOD_PATCH]
    with pytest.raises(RecoverError, match=r"h:/v: the recorded recipe's patches\[1\] is refused") as info:
        recorded_patches({"patches": [GOOD_PATCH, patch]}, "h:/v")
    assert problem in info.value.message and "snapshot" in info.value.hint


def test_recover_from_a_snapshot_without_a_manifest_is_refused(tmp_path):
    from transplant.recover.rebuild import RecoverError, from_snapshot
    from transplant.donor.snapshot import load_snapshot

    snap = load_snapshot(str(_index(tmp_path / "store", "s", {"alpha/x.py": OK})))
    object.__setattr__(snap, "manifest", {"data": ["not", "a", "manifest"]})
    with pytest.raises(RecoverError, match="holds no manifest"):
        from_snapshot(snap, _end("127.0.0.2", "/v"), tmp_path / "state", ssh={})
    assert not (tmp_path / "state").exists(), "nothing was written"


@pytest.mark.parametrize("donor, problem", [
    ({"host": "root@[bad", "venv": "/v"}, "damaged index"),
    ({"host": "h", "venv": "relative/v"}, "is not an absolute path"),
])
def test_an_index_naming_a_bad_donor_is_refused(tmp_path, donor, problem):
    from transplant.donor.snapshot import SnapshotError, _index_digest, load_snapshot

    path = _index(tmp_path / "store", "s", {"alpha/x.py": OK})
    doc = json.loads(path.read_text())
    doc["donor"] = donor
    doc["digest"] = _index_digest(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(SnapshotError, match=problem):
        load_snapshot(str(path))


def test_prune_leaves_stray_files_in_the_objects_folder_alone(tmp_path):
    from transplant.donor.snapshot import prune

    store = tmp_path / "store"
    _index(store, "good", {"alpha/x.py": OK})
    stray = store / "objects" / "zz" / "notes.txt"
    stray.parent.mkdir(parents=True)
    stray.write_text("mine")
    misplaced = store / "objects" / "00" / ("ab" * 32)
    misplaced.parent.mkdir()
    misplaced.write_text("x")
    orphan = tmp_path / "o"
    orphan.write_bytes(b"unused\n")
    cas.put(store, record_hash(b"unused\n"), orphan)
    assert prune(store, [])[1] == 1
    assert stray.exists() and misplaced.exists() and cas.has(store, OK["hash"])


def test_an_index_copied_out_of_its_store_is_refused_before_anything_is_written(tmp_path):
    from transplant.donor.snapshot import SnapshotError, load_snapshot

    path = _index(tmp_path / "store", "s", {"alpha/x.py": OK})
    elsewhere = tmp_path / "home" / "copy.json"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(path.read_bytes())
    with pytest.raises(SnapshotError, match="store's index/ folder") as info:
        load_snapshot(str(elsewhere))
    assert "bare snapshot id" in info.value.hint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home", "src", "store"], "no tmp/ beside the copy"
    assert load_snapshot("s", store=tmp_path / "store").id == "s"


def test_view_refuses_a_path_that_is_both_file_and_folder(tmp_path):
    from transplant.donor.snapshot import SnapshotError, SnapshotSource, load_snapshot

    path = _index(tmp_path / "store", "s", {"alpha/x.py": OK, "alpha/x.py/y.py": OK})
    with SnapshotSource(load_snapshot(str(path))) as source:
        with pytest.raises(SnapshotError, match="cannot write alpha/x.py/y.py into the view"):
            source.files(["alpha/x.py", "alpha/x.py/y.py"])
