"""The content-addressed store and the manifest keys of snapshots, fallbacks and fleets (no hosts)."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest

from transplant.errors import ManifestError
from transplant.core.hostspec import HostSpec
from transplant.core.manifest import Endpoint, SnapshotRef, parse_manifest
from transplant.donor import store as cas

BASE = {"version": 1, "overlay": ["alpha"]}
DONOR = {"host": "root@gpu-1", "venv": "/v"}


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_object_key_is_the_hex_of_the_record_hash():
    data = b"hello\n"
    assert cas.object_key(record_hash(data)) == hashlib.sha256(data).hexdigest()
    for bad in ("md5=abc", "sha256=", "sha256=AAAA", "nothing"):
        with pytest.raises(ValueError, match="not a RECORD sha256 hash"):
            cas.object_key(bad)


def test_put_checks_the_hash_and_stores_once(tmp_path):
    store = tmp_path / "store"
    source = tmp_path / "f"
    source.write_bytes(b"payload")
    digest = record_hash(b"payload")
    with pytest.raises(cas.StoreError, match="hashes to"):
        cas.put(store, record_hash(b"other"), source)
    assert not cas.object_sizes(store), "a file with the wrong content is not stored"
    assert cas.put(store, digest, source) is True
    assert cas.put(store, digest, source) is False, "already stored"
    assert cas.object_sizes(store) == {hashlib.sha256(b"payload").hexdigest(): 7}
    out = tmp_path / "out" / "f"
    assert cas.read_into(store, digest, out, mode=0o755) == 7
    assert out.read_bytes() == b"payload" and out.stat().st_mode & 0o777 == 0o755


def test_read_refuses_a_changed_or_missing_object(tmp_path):
    store = tmp_path / "store"
    source = tmp_path / "f"
    source.write_bytes(b"payload")
    digest = record_hash(b"payload")
    cas.put(store, digest, source)
    stored = cas.object_path(store, digest)
    stored.chmod(0o644)
    stored.write_bytes(b"paylOad")
    out = tmp_path / "out"
    with pytest.raises(cas.StoreError, match="hash mismatch") as info:
        cas.read_into(store, digest, out)
    assert str(stored) in info.value.message and "take the snapshot again" in info.value.hint
    assert not out.exists(), "a damaged file is never left behind"
    stored.unlink()
    with pytest.raises(cas.StoreError, match="is missing"):
        cas.read_into(store, digest, out)


def test_donor_snapshot_fallback_and_targets_parse():
    m = parse_manifest({**BASE, "donor": {"snapshot": "snaps/index/x.json",
                                          "fallback": [DONOR, {"snapshot": "20261130T000000Z-abcd"}]},
                        "targets": [{"host": "root@gpu-2", "venv": "/v"}, {"host": "root@gpu-3", "venv": "/v"}]},
                       path="m.yaml")
    assert m.donor == SnapshotRef(path="snaps/index/x.json")
    assert m.fallback == (Endpoint(host=HostSpec.parse("root@gpu-1"), venv="/v"),
                          SnapshotRef(path="20261130T000000Z-abcd"))
    assert [str(t) for t in m.targets] == ["root@gpu-2:/v", "root@gpu-3:/v"] and m.target == m.targets[0]
    one = parse_manifest({**BASE, "donor": DONOR, "target": {"host": "root@gpu-2", "venv": "/v"}}, path="m.yaml")
    assert one.targets == (one.target,) and one.fallback == ()


@pytest.mark.parametrize("data,problem", [
    ({"donor": DONOR}, "target: missing; fix: add it: target: {host: root@ct200, venv: /root/venv_sglang} "
                       "(or targets: [...] for several)"),
    ({"donor": DONOR, "target": DONOR | {"host": "x"}, "targets": [DONOR | {"host": "y"}]},
     "targets: both target and targets are given; fix: list every target under targets: and drop target:"),
    ({"donor": DONOR, "targets": []}, "targets: expected a non-empty list of {host, venv}, got an empty list; fix: write e.g. "
                                      "targets: [{host: root@gpu-1, venv: /root/venv}, {host: root@gpu-2, venv: "
                                      "/root/venv}]"),
    ({"donor": DONOR, "targets": [DONOR | {"host": "y"}, DONOR | {"host": "y"}]},
     "targets[1]: y:/v is listed twice; fix: keep one entry per host and venv"),
    ({"donor": DONOR | {"fallback": [{"host": "y", "venv": "/v"}]}, "targets": [DONOR | {"host": "y"}]},
     "targets[0]: the target is a fallback donor (y:/v); fix: name another host or venv as the target"),
    ({"donor": {"snapshot": ""}, "target": DONOR},
     "donor.snapshot: expected a non-empty string, got the string ''; fix: give the snapshot's index file or id "
     "(transplant snapshot --list)"),
    ({"donor": DONOR | {"fallback": "y"}, "target": DONOR | {"host": "z"}},
     "donor.fallback: expected a non-empty list, got the string 'y'; fix: write e.g. fallback: "
     "[{host: root@gpu-2, venv: /root/venv}, {snapshot: ID}]"),
    ({"donor": DONOR | {"fallback": [{"snapshot": "a", "host": "b"}]}, "target": DONOR | {"host": "z"}},
     "donor.fallback[0].host: unknown key; fix: remove it; allowed keys: snapshot, ca"),
])
def test_bad_source_and_target_keys(data, problem):
    with pytest.raises(ManifestError) as info:
        parse_manifest({**BASE, **data}, path="m.yaml")
    assert problem in info.value.problems


def _source(tmp_path, files: dict):
    from inventory_docs import dist, document
    from transplant.core.inventory import parse_inventory
    from transplant.donor.snapshot import Snapshot, SnapshotSource

    store = tmp_path / "store"
    src = tmp_path / "src"
    src.write_bytes(b"ok\n")
    cas.put(store, record_hash(b"ok\n"), src)
    inv = parse_inventory(document("/v", [dist("alpha", "1.0", {"alpha/x.py": "ok\n"})]), label="snapshot t")
    snap = Snapshot(id="t", path=store / "index" / "t.json", store=store, created=0.0, donor_host="h", donor_venv="/v",
                    overlay=("alpha",), dists=("alpha",), inventory=inv, files=files, patches=(), manifest={})
    return SnapshotSource(snap)


def test_view_refuses_paths_an_edited_index_would_write_outside_it(tmp_path):
    from transplant.donor.snapshot import SnapshotError

    ok = {"hash": record_hash(b"ok\n"), "size": 3, "mode": 0o644}
    outside = tmp_path / "outside"
    outside.mkdir()
    with _source(tmp_path, {"../../escape.py": ok, "pyvenv.cfg": ok, "link": {"symlink": str(outside)},
                            "link/x.py": ok, "lib/x.py": ok}) as source:
        host, root = source.files(["lib/x.py"])
        assert (Path(root) / "lib/x.py").read_bytes() == b"ok\n"
        for bad in ("../../escape.py", "pyvenv.cfg"):
            with pytest.raises(SnapshotError, match="refusing the path"):
                source.files([bad])
        source.files(["link"])
        with pytest.raises(SnapshotError, match="refusing the path 'link/x.py'"):
            source.files(["link/x.py"])
        assert not list(outside.iterdir()), "nothing was written through the symlink"
        with pytest.raises(SnapshotError, match="does not hold nope.py"):
            source.files(["nope.py"])
    assert not Path(root).exists(), "the view is removed on close"
