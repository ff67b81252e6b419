"""The file stream (``transplant.hosts.stream``): one pipe from a sender host script to a receiver
host script, files hashed as they are written, and what an apply does with those hashes. Real
processes, real loopback sshd hosts, real venvs; nothing mocked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from transplant import remote
from transplant.apply import txn
from transplant.errors import HostError
from transplant.hosts.host import LocalHost
from transplant.hosts.stream import UNAVAILABLE, stream_files
from transplant.remote._common import FRAME, STREAM_MAGIC, record_hash
from transplant.reporting import RecordingReporter

from conftest import lab_skip_reason

hosts = pytest.mark.skipif(lab_skip_reason() is not None, reason=str(lab_skip_reason()))


def _python() -> str:
    return getattr(sys, "_base_executable", sys.executable)


def _tree(root: Path, files: dict[str, bytes], modes: dict[str, int] | None = None) -> list[str]:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod((modes or {}).get(rel, 0o644))
    return sorted(files)


def _leftovers(root: Path) -> list[str]:
    """Temporary files a receiver would leave: none may survive a failure."""
    return [str(p) for p in root.rglob("*") if ".tp-" in p.name]


def _script(name: str, args: list[str], stdin: bytes) -> subprocess.CompletedProcess:
    """Run a host script as the controller does (``-I -S -c``), here on the controller."""
    return subprocess.run([sys.executable, "-I", "-S", "-c", remote.source(name).decode(), *args], input=stdin,
                          capture_output=True, timeout=120)


def _frame(kind: bytes, rel: str, data: bytes = b"", mode: int = 0o644) -> bytes:
    name = rel.encode()
    return FRAME.pack(kind, len(name), mode, len(data), 1_700_000_000_000_000_000) + name + data


def _end(entries: int) -> bytes:
    return FRAME.pack(b"E", 0, 0, entries, 0)


FILES = {
    "lib/python3.11/site-packages/pkg/__init__.py": b"x = 1\n",
    "lib/python3.11/site-packages/pkg/lib name with spaces.so": os.urandom(700_000),
    "bin/tool": b"#!/bin/sh\necho tool\n",
    "empty.txt": b"",
}


def test_local_to_local_moves_exactly_the_listed_files_hashed_as_written(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    listed = _tree(src, FILES, {"bin/tool": 0o755})
    os.utime(src / "bin/tool", ns=(1_600_000_000_000_000_000, 1_600_000_000_123_456_789))
    (src / "lib/link").symlink_to("python3.11/site-packages/pkg/__init__.py")
    (src / "not-listed").write_bytes(b"stays home")
    recorded = RecordingReporter()
    total = sum(len(d) for d in FILES.values())
    result = stream_files(LocalHost(), str(src), LocalHost(), str(dst), [*listed, "lib/link", "bin/tool"],
                          total=total, reporter=recorded)
    assert result.how == "stream" and result.compression is None
    assert result.files == len(FILES) + 1  # the duplicate is sent once
    for rel, data in FILES.items():
        assert (dst / rel).read_bytes() == data
        assert (dst / rel).stat().st_mode & 0o7777 == (src / rel).stat().st_mode & 0o7777
        digest, size, dev, ino, mtime_ns = result.written[rel]
        info = (dst / rel).stat()
        assert (digest, size) == (record_hash(data), len(data))
        assert (dev, ino, mtime_ns) == (info.st_dev, info.st_ino, info.st_mtime_ns)
    assert (dst / "bin/tool").stat().st_mtime_ns == 1_600_000_000_123_456_789
    assert os.readlink(dst / "lib/link") == "python3.11/site-packages/pkg/__init__.py"
    assert result.written["lib/link"][0] == "symlink:python3.11/site-packages/pkg/__init__.py"
    assert not (dst / "not-listed").exists() and _leftovers(dst) == []
    # bytes counted once: the stream's length, the content plus a frame header per entry
    assert total <= result.bytes <= total + 200 * (len(FILES) + 1)
    seen = [e[1:] for e in recorded.events if e[0] == "progress"]
    assert seen[-1] == (total, total) and all(a[0] <= b[0] for a, b in zip(seen, seen[1:], strict=False))


@hosts
def test_ssh_to_ssh_streams_once_through_the_controller(lab, lab_connect, tmp_path):
    donor, target = lab.hosts["donor"], lab.hosts["target"]
    for host in (donor, target):
        host.run(["rm", "-rf", "/srv/stream"])
    src = donor.path("/srv/stream/venv")
    listed = _tree(src, FILES, {"bin/tool": 0o755})
    (src / "lib/link").symlink_to("/srv/stream/venv/lib/python3.11")
    # on the target a listed file is a hardlink into a cache: the cache keeps its bytes
    target.run(["sh", "-c", "mkdir -p /srv/stream/cache /srv/stream/venv/bin && echo old > /srv/stream/cache/tool"
                " && ln /srv/stream/cache/tool /srv/stream/venv/bin/tool"])
    recorded = RecordingReporter()
    total = sum(len(d) for d in FILES.values())
    result = stream_files(lab_connect("donor"), "/srv/stream/venv", lab_connect("target"), "/srv/stream/venv",
                          [*listed, "lib/link"], src_python=_python(), dst_python=_python(), total=total,
                          reporter=recorded)
    dst = target.path("/srv/stream/venv")
    for rel, data in FILES.items():
        assert (dst / rel).read_bytes() == data
        assert result.written[rel][:2] == (record_hash(data), len(data))
        assert result.written[rel][3] == (dst / rel).stat().st_ino
    assert os.access(dst / "bin/tool", os.X_OK)
    assert target.path("/srv/stream/cache/tool").read_bytes() == b"old\n"
    assert os.readlink(dst / "lib/link") == "/srv/stream/venv/lib/python3.11"
    assert total <= result.bytes <= total + 200 * (len(FILES) + 1)  # once, not once per leg
    assert [e[1:] for e in recorded.events if e[0] == "progress"][-1] == (total, total)


@hosts
@pytest.mark.parametrize("method", ["zstd", "zlib"])
def test_a_compressed_stream_counts_its_compressed_bytes(lab, lab_connect, tmp_path, method):
    src = tmp_path / "src"
    text = b"".join(b"def f%d(x):\n    return x * %d\n" % (i, i) for i in range(40_000))
    listed = _tree(src, {"a/big.py": text, "a/random.bin": os.urandom(50_000)})
    lab.hosts["target"].run(["rm", "-rf", "/srv/zipped"])
    result = stream_files(LocalHost(), str(src), lab_connect("target"), "/srv/zipped", listed, compress=method,
                          dst_python=_python())
    assert result.compression == method
    assert lab.hosts["target"].path("/srv/zipped/a/big.py").read_bytes() == text
    assert result.written["a/big.py"][0] == record_hash(text)
    assert result.bytes < (len(text) + 50_000) / 3  # the wire carried the compressed stream


@pytest.mark.parametrize("relpath", ["../etc/passwd", "a/../../x", "/etc/passwd"])
def test_a_path_leaving_the_root_is_refused_by_the_controller(tmp_path, relpath):
    with pytest.raises(ValueError, match="refusing"):
        stream_files(LocalHost(), str(tmp_path), LocalHost(), str(tmp_path / "d"), ["ok", relpath])
    assert not (tmp_path / "d").exists()


def test_a_path_leaving_the_root_is_refused_by_the_sender(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "secret").write_bytes(b"outside")
    done = _script("stream_send", [str(tmp_path / "root")], b"../secret\0")
    assert done.returncode == 1 and b"refusing '../secret': it escapes the root" in done.stderr
    assert b"outside" not in done.stdout
    twin = _script("stream_send", [str(tmp_path)], b"secret\0")  # inside its root: sent
    assert twin.returncode == 0 and b"outside" in twin.stdout


@pytest.mark.parametrize("relpath", ["../evil", "a/../../evil", "/tmp/evil-abs"])
def test_a_path_leaving_the_root_is_refused_by_the_receiver(tmp_path, relpath):
    root = tmp_path / "staged"
    stream = STREAM_MAGIC + _frame(b"F", "ok", b"fine") + _frame(b"F", relpath, b"evil") + _end(2)
    done = _script("stream_receive", [str(root)], stream)
    reply = json.loads(done.stdout.splitlines()[-1])
    assert done.returncode == 1 and not reply["ok"] and "refusing" in reply["error"]
    assert not (tmp_path / "evil").exists() and not Path("/tmp/evil-abs").exists()
    assert _leftovers(tmp_path) == []
    twin = _script("stream_receive", [str(root)], STREAM_MAGIC + _frame(b"F", "ok", b"fine") + _end(1))
    assert twin.returncode == 0 and (root / "ok").read_bytes() == b"fine"


def test_a_symlink_planted_in_the_staged_folder_is_never_followed(tmp_path):
    src, dst, outside = tmp_path / "src", tmp_path / "staged", tmp_path / "outside"
    listed = _tree(src, {"lib/x.py": b"new\n", "bin/tool": b"tool\n"})
    outside.mkdir()
    (outside / "tool").write_bytes(b"precious\n")
    dst.mkdir()
    (dst / "lib").symlink_to(outside)  # a folder on the way is a symlink: refused
    with pytest.raises(HostError) as caught:
        stream_files(LocalHost(), str(src), LocalHost(), str(dst), listed)
    assert "the receiving side failed" in str(caught.value) and "refusing to write through lib" in str(caught.value)
    assert sorted(p.name for p in outside.iterdir()) == ["tool"] and _leftovers(dst) == []
    (dst / "lib").unlink()
    (dst / "bin/tool").unlink()  # the first entry, written before the refusal
    (dst / "bin/tool").symlink_to(outside / "tool")  # the name itself is a symlink: replaced, not written through
    stream_files(LocalHost(), str(src), LocalHost(), str(dst), listed)
    assert (outside / "tool").read_bytes() == b"precious\n"
    assert not (dst / "bin/tool").is_symlink() and (dst / "bin/tool").read_bytes() == b"tool\n"
    assert (dst / "lib/x.py").read_bytes() == b"new\n"


def test_a_file_that_vanished_stops_the_stream_with_the_sender_named(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _tree(src, {"a/first.bin": os.urandom(100_000), "a/third.py": b"3\n"})
    with pytest.raises(HostError) as caught:
        stream_files(LocalHost(), str(src), LocalHost(), str(dst), ["a/first.bin", "a/gone.py", "a/third.py"])
    message = str(caught.value)
    assert message.startswith(f"stream from local:{src}: the sending side failed (exit 1)")
    assert "a/gone.py: no such file" in message and "vanished since the plan" in message
    assert not (dst / "a/third.py").exists() and _leftovers(dst) == []


def test_a_stream_cut_inside_a_file_leaves_no_temporary_file(tmp_path):
    root = tmp_path / "staged"
    cut = STREAM_MAGIC + _frame(b"F", "a/whole.py", b"ok\n") + FRAME.pack(b"F", 6, 0o644, 1000, 0) + b"a/half" + b"x" * 10
    done = _script("stream_receive", [str(root)], cut)
    reply = json.loads(done.stdout.splitlines()[-1])
    assert done.returncode == 1 and reply["eof"] and "ended inside a/half" in reply["error"]
    assert not (root / "a/half").exists() and _leftovers(root) == []


def test_a_side_that_cannot_start_is_unavailable_not_a_failure(tmp_path):
    _tree(tmp_path / "src", {"f": b"x"})
    with pytest.raises(HostError) as caught:
        stream_files(LocalHost(), str(tmp_path / "src"), LocalHost(), str(tmp_path / "dst"), ["f"],
                     src_python=str(tmp_path / "no-python"))
    assert caught.value.code == UNAVAILABLE and "could not start" in str(caught.value)
    assert not (tmp_path / "dst/f").exists()


@hosts
def test_an_ssh_side_without_its_interpreter_is_unavailable(lab, lab_connect, tmp_path):
    _tree(tmp_path / "src", {"f": b"x"})
    with pytest.raises(HostError, match="could not start its interpreter") as caught:
        stream_files(LocalHost(), str(tmp_path / "src"), lab_connect("target"), "/srv/nopython", ["f"],
                     dst_python="/srv/no-such-venv/bin/python")
    assert caught.value.code == UNAVAILABLE


# -- single-pass hashing: the applier's check and state take the receiver's hashes --------------------


@pytest.fixture
def venv(tmp_path):
    """A real venv whose interpreter runs the applier, and a source folder of files to stage."""
    folder = tmp_path / "venv"
    subprocess.run([_python(), "-m", "venv", "--without-pip", str(folder)], check=True)
    src = tmp_path / "src"
    files = {f"lib/pkg/m{i}.py": f"M = {i}\n".encode() * (i + 1) for i in range(6)}
    _tree(src, files)
    return folder, src, files


def _staged(folder: Path, src: Path, files: dict[str, bytes], txid: str) -> tuple[dict, dict]:
    """Lock, begin a transaction and stream ``files`` into its staging folder: (expected, written)."""
    host, venv = LocalHost(), str(folder)
    expected = {rel: record_hash(data) for rel, data in files.items()}
    assert txn.call(host, venv, "lock", {"id": txid, "controller": "c", "pid": os.getpid(), "command": "t"})["ok"]
    reply = txn.call(host, venv, "begin", {"id": txid, "steps": [{"op": "put", "path": p} for p in sorted(files)],
                                           "after": expected, "bytes": 0, "source": "test"})
    result = stream_files(LocalHost(), str(src), LocalHost(), reply["staged"], sorted(files))
    return expected, {rel: list(entry) for rel, entry in result.written.items()}


def test_check_trusts_the_receivers_hashes_and_still_catches_a_changed_staged_file(venv):
    folder, src, files = venv
    host = LocalHost()
    with txn.session(host, str(folder)):
        expected, written = _staged(folder, src, files, "t1")
        checked = txn.call(host, str(folder), "check", {"id": "t1", "expect": expected, "written": written})
        assert checked["ok"] and checked["trusted"] == len(files) and checked["hashed"] == 0  # no second read
        staged = folder / ".transplant/txn/t1/staged/lib/pkg/m3.py"
        staged.write_bytes(b"X" * len(files["lib/pkg/m3.py"]))  # same size, other bytes, between receive and check
        checked = txn.call(host, str(folder), "check", {"id": "t1", "expect": expected, "written": written},
                           check=False)
        assert not checked["ok"] and checked["differ"][0].startswith("lib/pkg/m3.py: staged sha256=")
        assert checked["trusted"] == len(files) - 1 and checked["hashed"] == 1
        # without the receiver's hashes every file is read, as before
        assert txn.call(host, str(folder), "check", {"id": "t1", "expect": expected}, check=False)["hashed"] == 6


def test_the_final_check_trusts_committed_files_renamed_unchanged_and_catches_a_changed_one(venv):
    folder, src, files = venv
    host, path = LocalHost(), str(folder)
    with txn.session(host, path):
        expected, written = _staged(folder, src, files, "t2")
        verified = txn.call(host, path, "check", {"id": "t2", "expect": expected, "written": written})["verified"]
        txn.call(host, path, "commit", {"id": "t2", "lock": "t2"})
        reply = txn.call(host, path, "state", {"expect": expected, "known": verified})
        assert reply["differ"] == [] and reply["trusted"] == len(files)  # the fault-free twin: nothing read
        assert txn.check_state(host, path, expected, known=verified) == []
        live = folder / "lib/pkg/m1.py"
        live.write_bytes(b"Y" * live.stat().st_size)  # a committed file changed after the commit
        differ = txn.check_state(host, path, expected, known=verified)
        assert len(differ) == 1 and differ[0].startswith("lib/pkg/m1.py: content sha256=")
        assert txn.call(host, path, "state", {"expect": expected, "known": verified})["trusted"] == len(files) - 1


def test_a_transaction_keeps_the_stat_identities_of_settled_files_only_and_a_rollback_trusts_them(venv):
    """``begin`` keeps the stat identity of each file it read (``before-known.json``), ``check`` of
    each staged file it verified (``after-known.json``), but not of a file whose mtime lies in the
    racily-clean window (here: ahead of this host's clock, as a file written this very tick is):
    ``state`` with ``recorded`` reads those alone, before and after the rollback."""
    import time

    folder, src, files = venv
    host, path = LocalHost(), str(folder)
    live = {rel: b"old " + data for rel, data in files.items()}
    _tree(folder, live)
    past, ahead = time.time_ns() - 3600 * 10**9, time.time_ns() + 3600 * 10**9
    fresh = {"lib/pkg/m1.py", "lib/pkg/m4.py"}
    for tree in (folder, src):
        for rel in files:
            os.utime(tree / rel, ns=(past, ahead if rel in fresh else past))
    state = folder / ".transplant" / "txn" / "t3"
    with txn.session(host, path):
        expected, written = _staged(folder, src, files, "t3")
        known = json.loads((state / "before-known.json").read_text())
        assert sorted(known) == sorted(set(files) - fresh)
        assert all(known[rel][0] == record_hash(live[rel]) for rel in known)
        checked = txn.call(host, path, "check", {"id": "t3", "expect": expected, "written": written})
        assert sorted(checked["verified"]) == sorted(files), "the reply still names every file verified"
        assert sorted(json.loads((state / "after-known.json").read_text())) == sorted(set(files) - fresh)
        txn.call(host, path, "commit", {"id": "t3", "lock": "t3"})
        reply = txn.call(host, path, "state", {"expect": expected, "recorded": {"id": "t3", "of": "after"}})
        assert reply["differ"] == [] and reply["trusted"] == len(files) - 2 and reply["hashed"] == 2
        txn.call(host, path, "rollback", {"id": "t3", "lock": "t3"})
        before = {rel: record_hash(data) for rel, data in live.items()}
        reply = txn.call(host, path, "state", {"expect": before, "recorded": {"id": "t3", "of": "before"}})
        assert reply["differ"] == [] and reply["trusted"] == len(files) - 2 and reply["hashed"] == 2
        reply = txn.call(host, path, "state", {"expect": before})  # without: every file read
        assert reply["trusted"] == 0 and reply["hashed"] == len(files)
        for bad in ({"id": "t3", "of": "staged"}, {"id": "../t3", "of": "before"}, ["t3", "before"]):
            refused = txn.call(host, path, "state", {"expect": before, "recorded": bad}, check=False)
            assert not refused["ok"] and refused["error"].startswith("refused"), refused


# -- apply: the stream by default, rsync as the fallback, said in the output ----------------------------


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A donor venv with alpha 2.0 and a pristine target with alpha 1.0; ``target(name)`` copies the
    pristine one and writes its manifest (with a patch)."""
    from transplant.lab.wheels import build_wheel, make_venv

    base = tmp_path_factory.mktemp("pair")
    new = build_wheel(base / "w", "alpha", "2.0", {"alpha/__init__.py": "V = 2\n", "alpha/big.bin": "z" * 200_000})
    old = build_wheel(base / "w1", "alpha", "1.0", {"alpha/__init__.py": "V = 1\n"})
    donor, pristine = make_venv(base / "donor", [new]), make_venv(base / "pristine", [old])
    (base / "patches").mkdir()
    (base / "patches" / "p.py").write_text("P = 1\n")

    def target(name: str) -> tuple[Path, str]:
        venv = base / name
        subprocess.run(["cp", "-a", str(pristine), str(venv)], check=True)
        manifest = base / f"{name}.yaml"
        manifest.write_text(f"version: 1\ndonor: {{host: local, venv: {donor}}}\ntarget: {{host: local, venv: {venv}}}\n"
                            f"overlay: [alpha]\npatches:\n  - {{source: patches/p.py, dest: alpha/p.py}}\n")
        return venv, str(manifest)

    return target


def _applied(capsys, manifest: str) -> str:
    from transplant.cli.app import main

    assert main(["apply", manifest, "--yes"]) == 0
    return " ".join(capsys.readouterr().out.split())


def test_apply_streams_by_default_and_says_so(pair, capsys, monkeypatch):
    monkeypatch.delenv("TRANSPLANT_TRANSFER", raising=False)
    venv, manifest = pair("streamed")
    out = _applied(capsys, manifest)
    assert "files: streamed on this machine" in out and "hashed as written" in out
    assert "patches: streamed on this machine" in out
    assert (venv / "lib/python3.11/site-packages/alpha/p.py").read_text() == "P = 1\n"
    assert "on the wire (streamed on this machine)," in out  # the closing line says which path the bytes took
    applied = [e for e in txn.history(LocalHost(), str(venv))["events"] if e["event"] == "applied"][-1]
    assert 200_000 < applied["bytes_moved"] < 200_000 + 20_000  # the stream's length, recorded exactly


def test_apply_with_rsync_chosen_copies_with_rsync(pair, capsys, monkeypatch):
    monkeypatch.setenv("TRANSPLANT_TRANSFER", "rsync")
    venv, manifest = pair("rsynced")
    out = _applied(capsys, manifest)
    assert "files: copied with rsync" in out and "as TRANSPLANT_TRANSFER=rsync asks" in out and "streamed" not in out
    assert "(copied with rsync, as TRANSPLANT_TRANSFER=rsync asks)" in out  # the closing line: no nested brackets
    assert (venv / "lib/python3.11/site-packages/alpha/__init__.py").read_text() == "V = 2\n"


def test_a_bad_transfer_setting_is_a_clear_error(pair, capsys, monkeypatch):
    from transplant.cli.app import main

    monkeypatch.setenv("TRANSPLANT_TRANSFER", "scp")
    venv, manifest = pair("badly")
    assert main(["apply", manifest, "--yes"]) == 1
    out = " ".join(capsys.readouterr().out.split())
    assert "TRANSPLANT_TRANSFER='scp': not a way to copy files" in out and "Traceback" not in out
    assert (venv / "lib/python3.11/site-packages/alpha/__init__.py").read_text() == "V = 1\n"
    assert not (venv / ".transplant").exists()  # said before the lock: no transaction begun, none recorded


def test_compress_with_rsync_says_it_did_not_compress(pair, capsys, monkeypatch):
    from transplant.cli.app import main

    monkeypatch.setenv("TRANSPLANT_TRANSFER", "rsync")
    venv, manifest = pair("rsync-compress")
    assert main(["apply", manifest, "--yes", "--compress"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "files: copied with rsync" in out and "not compressed (--compress applies to the stream only)" in out


def test_apply_compress_compresses_the_stream_and_says_how(pair, capsys, monkeypatch):
    from transplant.cli.app import main

    monkeypatch.delenv("TRANSPLANT_TRANSFER", raising=False)
    venv, manifest = pair("compressed")
    assert main(["apply", manifest, "--yes", "--compress"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "files: streamed on this machine" in out and "zstd-compressed to" in out
    assert (venv / "lib/python3.11/site-packages/alpha/big.bin").read_text() == "z" * 200_000


@hosts
def test_a_file_that_vanished_on_an_ssh_donor_names_that_host(lab, lab_connect):
    donor = lab.hosts["donor"]
    donor.run(["sh", "-c", "rm -rf /srv/vanish && mkdir -p /srv/vanish/a && echo 1 > /srv/vanish/a/one.py"])
    lab.hosts["target"].run(["rm", "-rf", "/srv/vanished"])
    with pytest.raises(HostError) as caught:
        stream_files(lab_connect("donor"), "/srv/vanish", lab_connect("target"), "/srv/vanished",
                     ["a/one.py", "a/two.py"], src_python=_python(), dst_python=_python())
    assert str(caught.value).startswith(f"stream from {donor.spec}:/srv/vanish: the sending side failed (exit 1)")
    assert "a/two.py: no such file" in str(caught.value)
    assert _leftovers(lab.hosts["target"].path("/srv/vanished")) == []


def test_a_stream_past_its_timeout_is_stopped_on_both_sides(tmp_path):
    import threading

    listed = _tree(tmp_path / "src", {"f.bin": os.urandom(4 << 20)})
    release = threading.Event()

    def stuck(source: int, sink: int) -> None:  # a link that stops carrying bytes inside the file
        carried = 0
        while carried < 1 << 20:
            data = os.read(source, (1 << 20) - carried)
            carried += os.write(sink, data)
        release.wait(60)

    with pytest.raises(HostError, match="timed out after 1 s and was stopped"):
        stream_files(LocalHost(), str(tmp_path / "src"), LocalHost(), str(tmp_path / "dst"), listed, timeout=1,
                     link=stuck)
    release.set()
    # the receiver was inside the file: it removed its temporary file on the way out
    assert not (tmp_path / "dst/f.bin").exists() and _leftovers(tmp_path / "dst") == []


@hosts
def test_ssh_to_local_streams_into_the_controller(lab, lab_connect, tmp_path):
    lab.hosts["donor"].run(["sh", "-c", "rm -rf /srv/s2l && mkdir -p /srv/s2l/a && printf hello > /srv/s2l/a/f"])
    result = stream_files(lab_connect("donor"), "/srv/s2l", LocalHost(), str(tmp_path / "out"), ["a/f"],
                          src_python=_python())
    assert (tmp_path / "out/a/f").read_bytes() == b"hello"
    assert result.written["a/f"][:2] == (record_hash(b"hello"), 5) and result.files == 1


def test_a_stream_that_cannot_start_falls_back_to_rsync_and_says_so(tmp_path):
    from transplant.apply.execute import _transfer

    listed = _tree(tmp_path / "src", {"a/f.py": b"F = 1\n"})
    recorded = RecordingReporter()
    result, _ = _transfer("files", "stream", LocalHost(), str(tmp_path / "src"), str(tmp_path / "no-python"),
                       LocalHost(), str(tmp_path / "staged"), listed, staging=tmp_path / "state", total=6,
                       reporter=recorded, timeout=60, compress=False, target_python="unused")
    assert result.how == "rsync" and (tmp_path / "staged/a/f.py").read_bytes() == b"F = 1\n"
    assert recorded.notes()[0].startswith("files: the stream could not start (stream: the sending side")
    assert recorded.notes()[0].endswith("; copying with rsync instead")


def test_larger_files_are_written_out_to_disk_while_the_stream_goes_on(tmp_path, monkeypatch):
    """The receiver gives each file of at least ``_FLUSH_MIN`` bytes to the flusher's
    ``fdatasync`` each ``_FLUSH_STEP`` bytes and once written, and a small file never; the
    transfer's reply waits for them (``finish``)."""
    from transplant.remote import stream_receive as receiver

    given: list[str] = []

    class Recording(receiver._Flusher):
        def add(self, fd):
            given.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
            super().add(fd)

    monkeypatch.setattr(receiver, "_FLUSHER", Recording())
    monkeypatch.setattr(receiver, "_FLUSH_MIN", 4096)
    monkeypatch.setattr(receiver, "_FLUSH_STEP", 1 << 16)
    big, small = os.urandom(3 << 20), b"x" * 100
    data = STREAM_MAGIC + _frame(b"F", "pkg/big.so", big) + _frame(b"F", "pkg/small.py", small) + _end(2)
    (tmp_path / "stream").write_bytes(data)
    fd = os.open(tmp_path / "stream", os.O_RDONLY)
    try:
        files = receiver.receive(str(tmp_path / "staged"), receiver._Input(None, fd), receiver._Progress())
    finally:
        os.close(fd)
    receiver._FLUSHER.finish()
    assert files["pkg/big.so"][0] == record_hash(big) and (tmp_path / "staged/pkg/big.so").read_bytes() == big
    assert given and all(".big.so.tp-" in name for name in given), given  # written out under its temporary name
    assert len(given) >= 3, "a write-out each step of the file, and one when written whole"
    assert receiver._FLUSHER.thread is None


def test_a_failed_write_out_fails_the_transfer():
    from transplant.remote import stream_receive as receiver

    flusher = receiver._Flusher()
    read, write = os.pipe()  # fdatasync refuses a pipe (EINVAL), as it would report EIO from a disk
    try:
        flusher.add(write)
        with pytest.raises(receiver.Refused, match="writing the staged files out to disk failed"):
            flusher.finish()
    finally:
        os.close(read)
        os.close(write)
