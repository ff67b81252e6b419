"""Snapshots in a real OCI registry (Debian's docker-registry on loopback, TLS and htpasswd):
push and dedup, list and prune, bad credentials, apply from the registry with the donor gone,
a pull interrupted half-way that resumes, a tampered blob refused, a target that cannot reach
the registry relayed, and a three-target fleet."""

from __future__ import annotations

import base64
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from transplant.cli.app import main
from transplant.lab import Lab
from transplant.lab.registry import LabRegistry, registry_skip_reason
from transplant.lab.wheels import build_wheel
from transplant.donor.oci import Reference, RegistryError, find_credentials, parse_challenge

from conftest import lab_skip_reason
from test_snapshot_lab import ELF, SITE, VENV, _build_elf, files_of, install, write_manifest

NAMES = ("donor", "t1", "t2", "t3", "t4", "t5", "t6", "t7", "t8", "t9", "t10")


# -- pure parts: references, credentials, challenges ------------------------------------------------

def test_reference_forms_and_errors():
    ref = Reference.parse("oci://localhost:5000/team/snaps:v1")
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == ("localhost:5000", "team/snaps", "v1", None)
    pinned = Reference.parse("oci://reg.example/snaps@sha256:" + "a" * 64)
    assert pinned.tag is None and pinned.version == "sha256:" + "a" * 64 and str(pinned).endswith("a" * 64)
    assert Reference.parse("oci://reg.example/snaps", need_version=False).tag is None
    for bad, words in (("oci://reg.example/snaps", "name a tag or a digest"), ("oci://reg.example", "repository"),
                       ("oci://r/Snaps:v1", "not a valid repository"), ("oci://r/s@sha256:12", "64"),
                       ("docker://r/s:v1", "not a registry reference")):
        with pytest.raises(ValueError, match=words):
            Reference.parse(bad)


def test_credentials_from_env_docker_config_and_helpers(tmp_path):
    assert find_credentials("r:1", env={}, home=tmp_path) is None, "nothing configured: anonymous"
    creds = find_credentials("r:1", env={"TRANSPLANT_REGISTRY_USER": "u", "TRANSPLANT_REGISTRY_PASSWORD": "p"})
    assert (creds.username, creds.password) == ("u", "p") and "p" not in repr(creds)
    with pytest.raises(RegistryError, match="only one is set"):
        find_credentials("r:1", env={"TRANSPLANT_REGISTRY_USER": "u"})
    (tmp_path / ".docker").mkdir()
    config = tmp_path / ".docker" / "config.json"
    config.write_text(json.dumps({"auths": {"https://r:1/v1/": {"auth": base64.b64encode(b"me:s3:cret").decode()}}}))
    creds = find_credentials("r:1", env={}, home=tmp_path)
    assert (creds.username, creds.password) == ("me", "s3:cret") and str(config) in creds.source
    assert find_credentials("other:2", env={}, home=tmp_path) is None
    config.write_text(json.dumps({"auths": {"r:1": {"auth": "bm9jb2xvbg=="}}}))  # "nocolon"
    with pytest.raises(RegistryError, match="not base64 of user:password"):
        find_credentials("r:1", env={}, home=tmp_path)
    config.write_text(json.dumps({"credHelpers": {"r:1": "ecr-login"}}))
    with pytest.raises(RegistryError, match="docker-credential-ecr-login, which transplant does not run"):
        find_credentials("r:1", env={}, home=tmp_path)


def test_manifest_names_a_registry_snapshot_and_its_ca_and_a_bad_reference_is_clear(tmp_path):
    from transplant.errors import TransplantError
    from transplant.core.manifest import SnapshotRef, parse_manifest
    from transplant.donor.registry_snapshot import open_registry

    m = parse_manifest({"version": 1, "overlay": ["alpha"], "target": {"host": "root@gpu-1", "venv": "/v"},
                        "donor": {"snapshot": "oci://localhost:5000/snaps:v1", "ca": "ca.pem"}}, path="m.yaml")
    assert m.donor == SnapshotRef(path="oci://localhost:5000/snaps:v1", ca="ca.pem")
    with pytest.raises(TransplantError) as info:
        open_registry("oci://localhost:5000/snaps", base=tmp_path)
    assert "name a tag or a digest" in info.value.message and "oci://REGISTRY/REPO:TAG" in info.value.hint
    with pytest.raises(TransplantError) as info:
        open_registry("oci://localhost:5000/snaps:v1", ca="missing.pem", base=tmp_path)
    assert f"the CA bundle {tmp_path / 'missing.pem'} does not exist" in info.value.message


def test_challenge_parsing():
    scheme, params = parse_challenge('Bearer realm="https://auth.example/token",service="reg",scope="repository:a:pull"')
    assert scheme == "bearer" and params == {"realm": "https://auth.example/token", "service": "reg",
                                             "scope": "repository:a:pull"}
    assert parse_challenge('Basic realm="x"') == ("basic", {"realm": "x"})


# -- the real registry and lab ------------------------------------------------------------------

@pytest.fixture(scope="module")
def reglab(tmp_path_factory):
    """A lab (donor with alpha 1.1 + beta 2.0; targets t1..t9 with alpha 1.0) and a registry."""
    reason = lab_skip_reason() or registry_skip_reason()
    if reason:
        pytest.skip(reason)
    directory = Path(tempfile.mkdtemp(prefix="transplant-reglab-", dir="/tmp"))
    wheels = tmp_path_factory.mktemp("regwheels")
    _build_elf()
    a1 = build_wheel(wheels, "alpha", "1.0", {"alpha/__init__.py": "__version__ = '1.0'\n"})
    a2 = build_wheel(wheels, "alpha", "1.1", {"alpha/__init__.py": "__version__ = '1.1'\n",
                                              "alpha/libdevice.so": ELF.read_bytes(),
                                              "alpha/big.bin": bytes(range(256)) * 256,
                                              "alpha/same.py": "SAME = 1\n"})
    b = build_wheel(wheels, "beta", "2.0", {"beta/__init__.py": "import alpha\n__version__ = '2.0'\n"},
                    requires=("alpha>=1.1",))
    try:
        with Lab(directory / "lab", NAMES) as lab, LabRegistry(directory / "registry") as registry:
            install(lab.hosts["donor"], [a2, b])
            for name in NAMES[1:]:
                install(lab.hosts[name], [a1])
            yield lab, registry
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(autouse=True)
def _own_state(tmp_path, monkeypatch):
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker"))


def login(monkeypatch, registry, password=None):
    monkeypatch.setenv("TRANSPLANT_REGISTRY_USER", registry.user)
    monkeypatch.setenv("TRANSPLANT_REGISTRY_PASSWORD", password or registry.password)


def push(capsys, manifest, registry, tag, store):
    ref = f"oci://{registry.host}/lab/snaps:{tag}"
    assert main(["snapshot", manifest, "--out", str(store), "--push", ref, "--ca", str(registry.ca), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def registry_donor(registry, pushed):
    return f"{{snapshot: {pushed['pushed']}, ca: {registry.ca}}}"


def test_push_dedup_list_prune_and_credentials(reglab, tmp_path, capsys, monkeypatch):
    lab, registry = reglab
    m = write_manifest(tmp_path, lab)
    repo = f"oci://{registry.host}/lab/snaps"
    assert main(["snapshot", m, "--push", f"{repo}:anon", "--ca", str(registry.ca)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "asks for credentials and none were found" in out and "TRANSPLANT_REGISTRY_USER" in out
    login(monkeypatch, registry, password="wrong")
    assert main(["snapshot", m, "--push", f"{repo}:bad", "--ca", str(registry.ca)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "authentication failed with the credentials from the environment" in out and "wrong" not in out

    # the Docker credential file works as well as the environment
    monkeypatch.delenv("TRANSPLANT_REGISTRY_USER")
    monkeypatch.delenv("TRANSPLANT_REGISTRY_PASSWORD")
    docker = tmp_path / "docker"
    docker.mkdir()
    auth = base64.b64encode(f"{registry.user}:{registry.password}".encode()).decode()
    (docker / "config.json").write_text(json.dumps({"auths": {registry.host: {"auth": auth}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(docker))
    first = push(capsys, m, registry, "one", tmp_path / "store")
    assert first["blobs_uploaded"] == 3 and first["blobs_present"] == 0, "alpha, beta and the patches"
    assert first["bytes_uploaded"] > len(bytes(range(256)) * 256), first
    # another manifest over the same donor: another snapshot, whose distributions are all there already
    m2 = tmp_path / "m2.yaml"
    m2.write_text(Path(m).read_text() + "remove: [no-such-dist]\n")
    again = push(capsys, str(m2), registry, "two", tmp_path / "store")
    assert again["blobs_uploaded"] == 0 and again["blobs_present"] == 3, "unchanged distributions are not sent again"
    # only the new index (the donor's inventory, with its host's facts) and the manifest: not alpha's 64 KiB again
    assert again["bytes_uploaded"] < first["bytes_uploaded"] - len(bytes(range(256)) * 256), (first, again)
    assert again["pushed"].startswith(f"{repo}:two@sha256:")

    assert main(["snapshot", "--list", "--out", repo, "--ca", str(registry.ca), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["snapshots"]
    assert [s["tag"] for s in listed] == ["one", "two"] and listed[1]["id"] == again["id"]
    assert main(["snapshot", "--prune", "one", "--out", repo, "--ca", str(registry.ca)]) == 0
    assert "deleted one" in capsys.readouterr().out
    assert main(["snapshot", "--list", "--out", repo, "--ca", str(registry.ca), "--json"]) == 0
    assert [s["tag"] for s in json.loads(capsys.readouterr().out)["snapshots"]] == ["two"]
    assert main(["snapshot", "--prune", "nope", "--out", repo, "--ca", str(registry.ca)]) == 1
    assert "no tag nope; nothing was deleted" in " ".join(capsys.readouterr().out.split())
    # the same snapshot pushed under a second tag is one manifest: pruning one tag alone is refused
    same = push(capsys, str(m2), registry, "three", tmp_path / "store")
    assert same["id"] == again["id"] and same["existing"] is True
    assert main(["snapshot", "--prune", "two", "--out", repo, "--ca", str(registry.ca)]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "three holds the same snapshot" in out and "nothing was deleted" in out and "--prune three two" in out
    assert main(["snapshot", "--prune", "two", "three", "--out", repo, "--ca", str(registry.ca)]) == 0
    assert "deleted two" in capsys.readouterr().out
    assert main(["snapshot", "--list", "--out", repo, "--ca", str(registry.ca), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["snapshots"] == []
    # without the CA bundle, TLS verification against the system CAs fails: a clear error
    assert main(["snapshot", "--list", "--out", repo]) == 1
    assert "cannot be reached" in capsys.readouterr().out


def test_donor_gone_apply_from_the_registry_controller_carries_no_file_bytes(reglab, tmp_path, capsys, monkeypatch):
    lab, registry = reglab
    login(monkeypatch, registry)
    pushed = push(capsys, write_manifest(tmp_path, lab), registry, "gone", tmp_path / "store")
    lab.hosts["donor"].stop_sshd()
    try:
        fresh = tmp_path / "fresh"
        fresh.mkdir()
        shutil.copytree(tmp_path / "patches", fresh / "patches")
        pinned = write_manifest(fresh, lab, donor=registry_donor(registry, pushed))
        assert main(["plan", pinned, "--json", "--detailed-exitcode"]) == 2
        doc = json.loads(capsys.readouterr().out)
        assert pushed["pushed"] in doc["donor_source"]["source"]
        assert main(["apply", pinned, "--yes"]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert "straight from the registry" in out and "the controller carried none of them" in out
        wire = re.search(r"copied, (\d+) B on the wire", out)
        assert wire and int(wire.group(1)) < 1024, "only the patch file (from the manifest's folder) went by rsync"
        cache = Path(tmp_path / "state" / "oci-cache" / "objects")
        cached = {p.name for p in cache.glob("*/*")}
        index = json.loads(next((tmp_path / "state" / "oci-cache" / "index").glob("*.json")).read_text())
        from transplant.donor.store import object_key

        patches = {object_key(p["hash"]) for p in index["patches"]}
        assert cached == patches, "no file of a distribution went through the controller (the plan's ELF facts " \
                                  "came from the ELF layer), only the patch files (for recover)"
        assert main(["verify", pinned, "--json"]) == 0
        target = files_of(lab, "t1")
        assert target.pop("alpha/tuned.py") == b"TUNED = 15\n"
        assert target == files_of(lab, "donor")
        assert not list(lab.hosts["t1"].path(f"{VENV}/.transplant/blobs").glob("*")), "no blob left on the target"
    finally:
        lab.hosts["donor"].start_sshd()


def test_interrupted_pull_resumes_and_tampered_blob_is_refused(reglab, tmp_path, capsys, monkeypatch):
    lab, registry = reglab
    login(monkeypatch, registry)
    pushed = push(capsys, write_manifest(tmp_path, lab), registry, "resume", tmp_path / "store")
    m = write_manifest(tmp_path, lab, donor=registry_donor(registry, pushed), target="t2", name="r.yaml")
    before = files_of(lab, "t2")
    monkeypatch.setenv("TRANSPLANT_TEST_PULL_STOP_AFTER", "30000")
    assert main(["apply", m, "--yes"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "stopped part-way" in out and "apply again to resume" in out
    assert files_of(lab, "t2") == before, "the transaction was aborted: nothing changed"
    partial = list(lab.hosts["t2"].path(f"{VENV}/.transplant/blobs").glob("*.partial"))
    assert len(partial) == 1 and partial[0].stat().st_size == 30000
    monkeypatch.delenv("TRANSPLANT_TEST_PULL_STOP_AFTER")
    assert main(["apply", m, "--yes"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "resuming 30000 bytes kept from an interrupted pull" in out
    assert files_of(lab, "t2").pop("alpha/big.bin") == bytes(range(256)) * 256

    # a blob changed in the registry's storage is refused by digest on the target
    from transplant.donor.oci import Client

    client = Client(Reference.parse(pushed["pushed"]), ca=registry.ca,
                    credentials=find_credentials(registry.host))
    manifest, _ = client.get_manifest()
    beta = [layer for layer in manifest["layers"] if layer["annotations"]["org.transplant.dist"] == "beta"][0]
    victim = registry.blob_path(beta["digest"])
    original = victim.read_bytes()
    victim.write_bytes(original.replace(b"import alpha", b"import os  "))
    try:
        m3 = write_manifest(tmp_path, lab, donor=registry_donor(registry, pushed), target="t3", name="t.yaml")
        before = files_of(lab, "t3")
        assert main(["apply", m3, "--yes"]) == 1
        out = " ".join(capsys.readouterr().out.split())
        assert f"blob {beta['digest']} arrived with the digest" in out and "refused" in out
        assert files_of(lab, "t3") == before
        assert not list(lab.hosts["t3"].path(f"{VENV}/.transplant/blobs").glob("*")), "the bad blob was deleted"
    finally:
        victim.write_bytes(original)


def test_unreachable_registry_falls_back_to_the_relay_and_says_so(reglab, tmp_path, capsys, monkeypatch):
    lab, registry = reglab
    login(monkeypatch, registry)
    pushed = push(capsys, write_manifest(tmp_path, lab), registry, "relay", tmp_path / "store")
    # on t4, "localhost" resolves to an address where no registry listens (its own /etc/hosts,
    # bind-mounted in its mount namespace only): the registry is out of its reach
    host = lab.hosts["t4"]
    (host.root / "hosts").write_text("127.0.0.254 localhost\n")
    host.run(["mount", "--bind", "/srv/hosts", "/etc/hosts"])
    try:
        m = write_manifest(tmp_path, lab, donor=registry_donor(registry, pushed), target="t4", name="f.yaml")
        assert main(["apply", m, "--yes"]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert "cannot reach the registry" in out and "relaying the files through the controller instead" in out
        assert "straight from the registry" not in out
        assert files_of(lab, "t4").pop("alpha/big.bin") == bytes(range(256)) * 256
    finally:
        host.run(["umount", "/etc/hosts"], check=False)


def test_three_target_fleet_applies_from_the_registry(reglab, tmp_path, capsys, monkeypatch):
    lab, registry = reglab
    login(monkeypatch, registry)
    pushed = push(capsys, write_manifest(tmp_path, lab), registry, "fleet", tmp_path / "store")
    names = ["t5", "t6", "t7"]
    targets = "targets:\n" + "".join(f'  - {{host: "{lab.hosts[n].spec}", venv: {VENV}}}\n' for n in names)
    m = write_manifest(tmp_path, lab, donor=registry_donor(registry, pushed), name="fleet.yaml")
    Path(m).write_text(Path(m).read_text().replace(f'target: {{host: "{lab.hosts["t1"].spec}", venv: {VENV}}}\n',
                                                   targets))
    assert main(["apply", m, "--yes", "--verify", "--json", "--jobs", "3"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["donor"]["bytes_read"] == 0
    donor = files_of(lab, "donor")
    for one in report["targets"]:
        assert one["code"] == 0 and one["applied"]["bytes"] < 1024, "only the patch file went through the controller"
        assert "straight from the registry" in one["note"], one
    for n in names:
        got = files_of(lab, n)
        assert got.pop("alpha/tuned.py") == b"TUNED = 15\n" and got == donor


def test_elf_layer_answers_as_reading_the_files_would(reglab, tmp_path, capsys, monkeypatch):
    lab, registry = reglab
    login(monkeypatch, registry)
    pushed = push(capsys, write_manifest(tmp_path, lab), registry, "elf", tmp_path / "store")
    from transplant.donor.registry_snapshot import open_registry
    from transplant.donor.snapshot import SnapshotSource, load_snapshot
    from transplant.donor.store import object_key

    local = load_snapshot(pushed["path"])
    objects = sorted(p for p in local.files if p.endswith(".so"))
    assert objects == [f"{SITE}/alpha/libdevice.so"]
    with open_registry(pushed["pushed"], ca=str(registry.ca)) as remote, SnapshotSource(local) as view:
        for kwargs in ({"device_code": True}, {"device_code": False, "torch_symbols_skip": objects},
                       {"torch_symbols": False}):
            got, want = remote.elf(objects, **kwargs), view.elf(objects, **kwargs)
            assert got.files == want.files and got.defined == want.defined, kwargs
        cache = remote.snapshot.store / "objects"
        assert {p.name for p in cache.glob("*/*")} == {object_key(p["hash"]) for p in local.patches}, \
            "answered from the ELF layer: no shared object pulled"
        # a request the layer cannot answer (the interpreter's libstdc++) reads the files: pulled then
        fallback = remote.elf(objects, libstdcxx=True)
        assert fallback.files[objects[0]].machine == view.elf(objects).files[objects[0]].machine
        assert len(list(cache.glob("*/*"))) > len(local.patches)


def test_recover_from_a_registry_snapshot_with_the_donor_gone(reglab, tmp_path, capsys, monkeypatch):
    lab, registry = reglab
    login(monkeypatch, registry)
    pushed = push(capsys, write_manifest(tmp_path, lab), registry, "recover", tmp_path / "store")
    lab.hosts["donor"].stop_sshd()
    try:
        assert main(["recover", "--target", f"{lab.hosts['t8'].spec}:{VENV}", "--snapshot", pushed["pushed"],
                     "--ca", str(registry.ca), "--yes"]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert f"rebuilding snapshot {pushed['id']}" in out and "recovered" in out
        assert "straight from the registry" in out and "the controller carried none of them" in out
        got = files_of(lab, "t8")
        assert got.pop("alpha/tuned.py") == b"TUNED = 15\n" and got == files_of(lab, "donor")
    finally:
        lab.hosts["donor"].start_sshd()


def test_prune_on_a_registry_with_deletes_disabled_is_a_clear_error(tmp_path, capsys, monkeypatch):
    reason = registry_skip_reason()
    if reason:
        pytest.skip(reason)
    from transplant.donor.oci import Client, Credentials, MANIFEST_TYPE
    from transplant.donor.registry_snapshot import ARTIFACT_TYPE, CONFIG_TYPE

    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    with LabRegistry(tmp_path / "registry", delete=False) as registry:
        login(monkeypatch, registry)
        client = Client(Reference.parse(f"oci://{registry.host}/lab/snaps:v1"), ca=registry.ca,
                        credentials=Credentials(registry.user, registry.password, "test"))
        (tmp_path / "config.json").write_text("{}")
        digest = "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"  # sha256 of "{}"
        assert client.upload_blob(tmp_path / "config.json", digest) == 2
        assert client.upload_blob(tmp_path / "config.json", digest) == 0, "HEAD first: not sent again"
        body = json.dumps({"schemaVersion": 2, "mediaType": MANIFEST_TYPE, "artifactType": ARTIFACT_TYPE,
                           "config": {"mediaType": CONFIG_TYPE, "digest": digest, "size": 2}, "layers": []}).encode()
        client.put_manifest("v1", body)
        repo = f"oci://{registry.host}/lab/snaps"
        assert main(["snapshot", "--prune", "v1", "--out", repo, "--ca", str(registry.ca)]) == 1
        out = " ".join(capsys.readouterr().out.split())
        assert "deleting manifests is disabled on this registry" in out and "storage.delete.enabled" in out
        assert main(["snapshot", "--list", "--out", repo, "--ca", str(registry.ca), "--json"]) == 0
        assert [s["tag"] for s in json.loads(capsys.readouterr().out)["snapshots"]] == ["v1"], "nothing was deleted"


def test_bearer_token_registry_push_and_the_target_pulls_with_a_token(reglab, tmp_path, capsys, monkeypatch):
    lab, _ = reglab
    with LabRegistry(tmp_path / "token-registry", token=True) as registry:
        login(monkeypatch, registry)
        pushed = push(capsys, write_manifest(tmp_path, lab), registry, "tok", tmp_path / "store")
        issued = registry.tokens_issued
        assert issued >= 1, "the registry asked for a bearer token and the token server gave it"
        m = write_manifest(tmp_path, lab, donor=registry_donor(registry, pushed), target="t9", name="tok.yaml")
        assert main(["apply", m, "--yes"]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert "straight from the registry" in out
        assert registry.tokens_issued > issued
        got = files_of(lab, "t9")
        assert got.pop("alpha/tuned.py") == b"TUNED = 15\n" and got == files_of(lab, "donor")
        login(monkeypatch, registry, password="wrong")
        assert main(["plan", m]) == 1
        out = " ".join(capsys.readouterr().out.split())
        assert "authentication failed with the credentials from the environment" in out


@pytest.mark.parametrize("digest", ["sha256:../../escaped", "md5:" + "0" * 32, "sha256:" + "A" * 64])
def test_the_target_side_puller_refuses_a_digest_that_is_not_sha256_hex(tmp_path, digest):
    """The digest names a file in the cache folder: a crafted one must not reach the disk."""
    import subprocess

    script = Path(__file__).resolve().parent.parent / "transplant" / "remote" / "oci_pull.py"
    request = {"blobs": [{"digest": digest, "size": 1, "files": [["lib/x.py", 0o644]]}],
               "cache": str(tmp_path / "cache"), "dest": str(tmp_path / "dest"), "url": "https://127.0.0.1:9/v2/r"}
    done = subprocess.run([sys.executable, "-I", str(script)], input=json.dumps(request), capture_output=True,
                          text=True, timeout=60)
    reply = json.loads(done.stdout)
    assert reply["ok"] is False and "refusing the blob digest" in reply["error"]
    assert not (tmp_path / "cache").exists() and not (tmp_path / "escaped").exists()


# -- a hostile registry in front of the real one: apply refuses, the target is unchanged ----------

def _proxy(registry, mode: str, victim: str, storage=None):
    """A TLS server (the lab registry's certificate) that passes every request on to ``registry``,
    except a GET of blob ``victim``: answered ``endless`` (no end, no length), ``trickle`` (a byte
    every half second) or ``downgrade`` (a redirect to ``storage``, plain http)."""
    import ssl
    import time
    import urllib.error
    import urllib.request

    from test_registry_hostile import Server

    upstream = urllib.request.build_opener(
        urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=str(registry.ca))))

    def serve(h) -> None:
        if h.command == "GET" and h.path.endswith(f"/blobs/{victim}"):
            h.send_response(307 if mode == "downgrade" else 200)
            if mode == "downgrade":
                h.send_header("Location", f"{storage.url}{h.path}")
                h.send_header("Content-Length", "0")
            elif mode == "trickle":
                h.send_header("Content-Length", "100000")
            h.end_headers()
            for n in range(1 << 30):
                if mode == "downgrade" or (mode == "trickle" and n >= 60):
                    return
                server.write(h, b"x" * (1 if mode == "trickle" else 65536))
                if mode == "trickle":
                    time.sleep(0.5)
        size = int(h.headers.get("Content-Length") or 0)
        request = urllib.request.Request(f"https://localhost:{registry.port}{h.path}", method=h.command,
                                         data=h.rfile.read(size) if size else None)
        for key in ("Authorization", "Range", "Accept", "Content-Type"):
            if h.headers.get(key):
                request.add_header(key, h.headers[key])
        try:
            with upstream.open(request, timeout=30) as response:
                status, headers, body = response.status, response.headers, response.read()
        except urllib.error.HTTPError as exc:
            status, headers, body = exc.code, exc.headers, exc.read()
        h.send_response(status)
        for key in ("WWW-Authenticate", "Content-Type", "Docker-Content-Digest", "Content-Range", "Location"):
            if headers.get(key):
                h.send_header(key, headers[key])
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)

    server = Server(serve, cert=registry.ca)
    return server


def test_a_hostile_registry_is_refused_by_apply_on_the_target_and_the_relay(reglab, tmp_path, capsys, monkeypatch):
    import time

    from test_registry_hostile import Server

    lab, registry = reglab
    login(monkeypatch, registry)
    pushed = push(capsys, write_manifest(tmp_path, lab), registry, "hostile", tmp_path / "store")
    from transplant.donor.oci import Client

    manifest, _ = Client(Reference.parse(pushed["pushed"]), ca=registry.ca,
                         credentials=find_credentials(registry.host)).get_manifest()
    alpha = [layer for layer in manifest["layers"] if layer["annotations"]["org.transplant.dist"] == "alpha"][0]
    before = files_of(lab, "t10")
    blobs = lab.hosts["t10"].path(f"{VENV}/.transplant/blobs")

    def apply_through(proxy) -> str:
        donor = pushed["pushed"].replace(registry.host, proxy.registry)
        m = write_manifest(tmp_path, lab, donor=f"{{snapshot: {donor}, ca: {registry.ca}}}", target="t10",
                           name="hostile.yaml")
        assert main(["apply", m, "--yes"]) == 1
        out = " ".join(capsys.readouterr().out.split())
        assert "Traceback" not in out
        assert files_of(lab, "t10") == before, "refused: nothing changed on the target"
        return out

    # an endless blob: cut at its size on the target (the partial deleted) ...
    with _proxy(registry, "endless", alpha["digest"]) as proxy:
        out = apply_through(proxy)
        assert f"blob {alpha['digest']} kept coming past its descriptor's {alpha['size']} bytes: refused" in out
        assert not list(blobs.glob("*")), "nothing of the endless blob was kept on the target"
        # ... and on the controller's relay path, for a target that cannot reach the registry
        host = lab.hosts["t10"]
        (host.root / "hosts").write_text("127.0.0.254 localhost\n")
        host.run(["mount", "--bind", "/srv/hosts", "/etc/hosts"])
        try:
            out = apply_through(proxy)
        finally:
            host.run(["umount", "/etc/hosts"], check=False)
        assert "relaying the files through the controller instead" in out
        assert f"kept coming, more than its descriptor's {alpha['size']} bytes: refused" in out
        assert 0 < proxy.sent < 64 << 20, "the endless blob was sent, and read only in part"
        assert not list((tmp_path / "state" / "oci-cache").rglob("blob.tar")), "nothing kept on the controller"

    # a trickle: stopped by the progress deadline, not left at "copying ..." for ever
    monkeypatch.setenv("TRANSPLANT_REGISTRY_PROGRESS", "64/1")
    with _proxy(registry, "trickle", alpha["digest"]) as proxy:
        started = time.monotonic()
        out = apply_through(proxy)
        assert "came slower than 64 bytes in 1 s: stopped" in out
        assert time.monotonic() - started < 25
    monkeypatch.delenv("TRANSPLANT_REGISTRY_PROGRESS")

    # a redirect from https down to http: refused, the http address never asked
    with Server(lambda h: None) as storage, _proxy(registry, "downgrade", alpha["digest"], storage) as proxy:
        out = apply_through(proxy)
        assert "which is not https: refused" in out
        assert storage.seen == []
