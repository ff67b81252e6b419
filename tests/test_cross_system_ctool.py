"""``c-toolchain-missing`` and verify's triton check between lab hosts whose systems differ.

The lab roots are debootstrap minbase: no C compiler. The trixie donor and trixie's twin get a
real one, Debian's ``gcc`` installed in each host's own layer by apt (measured: 21 s for both at
once on a 2-core machine under load, 7 s to purge them afterwards), the name triton's launcher
build finds on PATH first; bookworm keeps none. The
venvs run this machine's shared Python build (its include folder holds Python.h), and one on
bookworm runs Debian's own python3 without python3.11-dev: no Python.h. triton is a wheel of
that name (what the rule reads is the distribution; what verify reads is that it imports).

Judged here: the target without a compiler blocks while the donor has one; the twin with one is
clean; the donor without one either makes it info; the Debian-Python venv is told the packages;
verify's triton check fails naming the missing compiler on bookworm, not a skip."""

from __future__ import annotations

import json
import textwrap
import threading
from pathlib import Path

import pytest

from transplant.cli import main
from transplant.lab.wheels import build_wheel

from system_hosts import shared_python

pytestmark = pytest.mark.hosts

VENV, SYSTEM_VENV = "/srv/ctool", "/srv/ctool-sys"
SMOKE = Path(__file__).parent.parent / "transplant" / "remote" / "stage_smoke.py"
APT = {"DEBIAN_FRONTEND": "noninteractive"}
#: dpkg without its fsync calls, which nothing here needs (measured here: install 29 s -> 21 s, purge 13 s -> 7 s).
UNSAFE_IO = ["-o", "Dpkg::Options::=--force-unsafe-io"]


def _each(hosts, step) -> None:
    """``step(host)`` on every host at once; the first failure raised."""
    failures: list[BaseException] = []

    def one(host):
        try:
            step(host)
        except BaseException as exc:  # noqa: BLE001 - raised again below, in the test's thread
            failures.append(exc)

    threads = [threading.Thread(target=one, args=(h,)) for h in hosts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        raise failures[0]


def _install_gcc(host) -> None:
    host.run(["apt-get", "update", "-q"], env=APT, timeout=300)
    host.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *UNSAFE_IO, "gcc"], env=APT, timeout=300)


def _remove_gcc(host) -> None:
    host.run(["apt-get", "purge", "-y", "-q", "--autoremove", *UNSAFE_IO, "gcc"], env=APT, timeout=300, check=False)
    host.run(["apt-get", "clean"], env=APT, check=False)
    host.run(["sh", "-c", "rm -rf /var/lib/apt/lists/*"], check=False)


def _plan(systems, folder: Path, target: str, venv: str) -> tuple[int, dict]:
    """``transplant plan`` of triton from the trixie donor to ``target:venv``: (exit code, plan)."""
    manifest, out = folder / f"to-{target}-{venv.strip('/').replace('/', '-')}.yaml", folder / "plan.json"
    manifest.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: "{systems.hosts['trixie'].spec}", venv: {VENV}}}
        target: {{host: "{systems.hosts[target].spec}", venv: {venv}}}
        ssh: {{identity_file: {systems.identity_file}, known_hosts: {systems.known_hosts}}}
        overlay: [triton]
        """))
    out.unlink(missing_ok=True)
    code = main(["plan", str(manifest), "--out", str(out)])
    return code, json.loads(out.read_text())


def _smoke_triton(host, venv: str) -> dict:
    """verify's smoke script's triton sub-check, run by ``venv``'s python on ``host`` (no GPU here)."""
    host.install("/srv/stage_smoke.py", SMOKE.read_bytes())
    code = "import json, runpy; s = runpy.run_path('/srv/stage_smoke.py'); print(json.dumps(s['_triton'](None, 'cpu')))"
    return json.loads(host.run([f"{venv}/bin/python", "-c", code]).stdout)


@pytest.fixture(scope="module")
def plans(systems, tmp_path_factory):
    """The plans and smoke answers, in the order the hosts' systems change: first with no
    compiler anywhere, then with gcc in trixie and its twin (removed again afterwards: the
    hosts are the session's)."""
    build = shared_python()
    if build is None:
        pytest.skip("this machine's Python is the system's own: no one build to bind into hosts of two releases")
    folder = tmp_path_factory.mktemp("ctool")
    wheel = build_wheel(folder, "triton", "3.5.0", {"triton/__init__.py": ""})
    python = f"{build}/bin/python3"
    trixie, bookworm, twin = (systems.hosts[n] for n in ("trixie", "bookworm", "trixie-twin"))
    for host in (trixie, bookworm, twin):
        host.run(["rm", "-rf", VENV, SYSTEM_VENV, "/srv/ctool-wheels"])
        host.run([python, "-m", "venv", "--without-pip", VENV])
    bookworm.run(["/usr/bin/python3", "-m", "venv", "--without-pip", SYSTEM_VENV])
    for host in (trixie, bookworm, twin):
        host.install(f"/srv/ctool-wheels/{wheel.name}", wheel.read_bytes())

    def add_triton(host):
        host.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                  "--prefix", VENV, f"/srv/ctool-wheels/{wheel.name}"])

    add_triton(trixie)
    out = {"nowhere": _plan(systems, folder, "bookworm", VENV)}
    try:
        _each((trixie, twin), _install_gcc)
        out["bookworm"] = _plan(systems, folder, "bookworm", VENV)
        out["twin"] = _plan(systems, folder, "trixie-twin", VENV)
        out["debian-python"] = _plan(systems, folder, "bookworm", SYSTEM_VENV)
        # verify's check, once the targets hold triton (after the plans, which it would change)
        for host in (bookworm, twin):
            add_triton(host)
        out["smoke-bookworm"] = _smoke_triton(bookworm, VENV)
        out["smoke-twin"] = _smoke_triton(twin, VENV)
        yield out
    finally:
        _each((trixie, twin), _remove_gcc)
        for host in (trixie, bookworm, twin):
            host.run(["rm", "-rf", VENV, SYSTEM_VENV, "/srv/ctool-wheels", "/srv/stage_smoke.py"], check=False)


def findings(doc: dict) -> list[dict]:
    return [f for f in doc["findings"] if f["code"] == "c-toolchain-missing"]


def test_a_target_without_the_compiler_the_donor_has_blocks_triton(plans):
    code, doc = plans["bookworm"]
    [f] = findings(doc)
    assert f["severity"] == "error" and f["dists"] == ["triton"]
    assert "no C compiler (CC is unset and neither gcc nor clang is on PATH)" in f["message"]
    assert "builds it with /usr/bin/gcc" in f["message"] and "Python.h" not in f["hint"]
    assert f["hint"].startswith("on the target, as root: apt-get install -y gcc (")
    assert code == 3


def test_the_twin_with_the_compiler_is_clean(plans):
    code, doc = plans["twin"]
    assert not findings(doc)
    assert not [f for f in doc["findings"] if f["severity"] == "error"], doc["findings"]
    assert code == 0


def test_a_donor_without_the_compiler_either_is_not_an_error(plans):
    code, doc = plans["nowhere"]
    [f] = findings(doc)
    assert f["severity"] == "info" and "the donor's host (trixie) has no C compiler" in f["message"]
    assert code == 0


def test_debian_s_own_python_without_its_headers_is_told_both_packages(plans):
    _, doc = plans["debian-python"]
    [f] = findings(doc)
    assert f["severity"] == "error" and "no Python.h in /usr/include/python3.11" in f["message"]
    assert f["hint"].startswith("on the target, as root: apt-get install -y gcc python3.11-dev (")


def test_verify_fails_triton_on_the_host_without_a_compiler_and_skips_it_for_want_of_a_gpu_on_the_twin(plans):
    assert plans["smoke-bookworm"] == {
        "name": "triton kernel", "status": "fail",
        "reason": "no C compiler (CC is unset and neither gcc nor clang is on PATH): triton builds its kernel "
                  "launcher with them at the first launch, so every triton kernel fails here"}
    assert plans["smoke-twin"]["status"] == "skip" and plans["smoke-twin"]["needs"] == "gpu"
