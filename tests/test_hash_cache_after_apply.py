"""The applier's commit gives the target's hash cache the files it wrote (``_Warm`` in
``remote/applier.py``): the plan right after ``apply`` re-hashes none of the bytes apply just
verified and renamed into place, and a file changed after the apply, even one whose mtime was set
back to the recorded value, is hashed again and seen by the plan. Real venvs from real wheels,
the real ``transplant apply`` and ``transplant plan`` processes, the real probe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from transplant.hosts.host import LocalHost
from transplant.hosts.probing import run_script
from transplant.lab.wheels import build_wheel, make_venv

SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
BIG = 17 << 20  # two of them: past the 32 MiB below which the commit leaves the cache alone


def _files(seed: bytes) -> dict[str, str | bytes]:
    files: dict[str, str | bytes] = {f"alpha/m{i}.py": f"value = {i!r} + {seed!r}\n" for i in range(10)}
    for name in ("big1.bin", "big2.bin"):
        files[f"alpha/{name}"] = os.urandom(BIG)
    return files


def _transplant(root: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRANSPLANT_STATE_DIR": str(root / "state"), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "transplant", *argv], env=env, capture_output=True, text=True,
                          timeout=300)


def _probe(venv: Path) -> dict:
    """The target's probe as a plan asks it (the venv's own hash cache, its default racy rule and size floor)."""
    return run_script(LocalHost(), str(venv), "probe", ["--stdin"],
                      request={"hash": ["alpha"], "hash_cache": {"enabled": True}})


def _hashes(document: dict) -> dict[str, str]:
    (alpha,) = [d for d in document["distributions"] if d["name"] == "alpha"]
    return {e["venv_path"]: e["hash"] for e in alpha["record"] if e.get("hash")}


@pytest.fixture(scope="module")
def applied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A donor (alpha 2.0, installed an hour ago: its files' mtimes are old) applied onto a
    target (alpha 1.0) by ``transplant plan`` then ``transplant apply --yes``."""
    root = tmp_path_factory.mktemp("afterapply")
    make_venv(root / "donor", [build_wheel(root / "w2", "alpha", "2.0", _files(b"donor"))])
    make_venv(root / "target", [build_wheel(root / "w1", "alpha", "1.0", _files(b"target"))])
    old = time.time() - 3600
    for folder, _, names in os.walk(root / "donor" / SITE):
        for name in names:
            os.utime(os.path.join(folder, name), (old, old))
    (root / "m.yaml").write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: local, venv: {root / 'donor'}}}
        target: {{host: local, venv: {root / 'target'}}}
        overlay: [alpha]
        """))
    for argv in (("plan", str(root / "m.yaml"), "--json"), ("apply", str(root / "m.yaml"), "--yes")):
        done = _transplant(root, *argv)
        assert done.returncode in (0, 2), done.stdout + done.stderr
    return root


def test_the_plan_right_after_apply_hashes_none_of_the_files_apply_wrote(applied: Path) -> None:
    target = applied / "target"
    donor_hashes = _hashes(_probe(applied / "donor"))
    document = _probe(target)
    report = document["hash_cache"]
    hashes = _hashes(document)
    assert hashes[f"{SITE}/alpha/big1.bin"] == donor_hashes[f"{SITE}/alpha/big1.bin"], "apply did not take"
    # what apply wrote and check verified is a hit: every file but the RECORD (whose identity is
    # its normalised form, not its hash) and nothing that is not the applied alpha 2.0
    record = f"{SITE}/alpha-2.0.dist-info/RECORD"
    assert report["misses"] <= 1, report
    assert report["hits"] >= len(hashes) - 1, report
    assert report["hashed_bytes"] <= (target / record).stat().st_size, report
    assert report["hashed_bytes"] < BIG


def test_a_file_changed_after_apply_with_its_mtime_set_back_is_hashed_again(applied: Path) -> None:
    target = applied / "target"
    big = target / SITE / "alpha" / "big2.bin"
    before = big.stat()
    data = bytearray(big.read_bytes())
    data[:4] = bytes(b ^ 0xFF for b in data[:4])  # same size, other bytes
    big.write_bytes(bytes(data))
    os.utime(big, ns=(before.st_atime_ns, before.st_mtime_ns))  # mtime as recorded; ctime moves on
    after = big.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    document = _probe(target)
    assert document["hash_cache"]["hashed_bytes"] >= BIG, document["hash_cache"]
    from transplant.remote._common import record_hash
    assert _hashes(document)[f"{SITE}/alpha/big2.bin"] == record_hash(bytes(data))
    # and the operator's plan sees the change: the file is to be copied again
    done = _transplant(applied, "plan", str(applied / "m.yaml"), "--json")
    assert done.returncode in (0, 2), done.stdout + done.stderr
    (alpha,) = [c for c in json.loads(done.stdout)["changes"] if c["name"] == "alpha"]
    assert alpha["action"] != "keep" and json.dumps(alpha["copy"]).count("alpha/big2.bin") == 1, alpha
    assert "alpha/big1.bin" not in json.dumps(alpha["copy"]), "an unchanged file is not copied"
