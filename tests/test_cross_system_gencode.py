"""``gencode-runtime-mismatch`` between lab hosts: one donor on trixie whose generated protobuf
module (protoc 5.27.0) moves to bookworm, whose venv keeps protobuf 4.25.3, and to trixie's twin,
whose venv has the donor's protobuf 5.27.0. The same bytes are refused on the one target and
clean on the other: the fault depends on the runtime the target's venv holds, not on the host's
system (the probe reads the stamps on each host)."""

from __future__ import annotations

import json
import textwrap

import pytest

from transplant.cli import main
from transplant.lab.wheels import build_wheel

from system_hosts import shared_python
from test_gencode import _pb2

pytestmark = pytest.mark.hosts

VENV = "/srv/gencode"


@pytest.fixture(scope="module")
def hosts(systems, tmp_path_factory):
    """The donor venv (protobuf 5.27.0 and ``svc``) on trixie; bookworm's venv with protobuf
    4.25.3, the twin's with 5.27.0."""
    build = shared_python()
    if build is None:
        pytest.skip("this machine's Python is the system's own: no one build to bind into hosts of two releases")
    tmp = tmp_path_factory.mktemp("gencode-lab")
    protobuf = {v: build_wheel(tmp / v, "protobuf", v, {"google/protobuf/__init__.py": f"__version__ = '{v}'\n"})
                for v in ("4.25.3", "5.27.0")}
    svc = build_wheel(tmp / "svc", "svc", "1.0", {"svc/__init__.py": "", "svc/api_pb2.py": _pb2("5.27.0", "svc/api.proto")})
    python = f"{build}/bin/python3"
    for name, wheels in (("trixie", [protobuf["5.27.0"], svc]), ("bookworm", [protobuf["4.25.3"]]),
                         ("trixie-twin", [protobuf["5.27.0"]])):
        host = systems.hosts[name]
        host.run(["rm", "-rf", VENV, "/srv/gencode-wheels"])
        host.run([python, "-m", "venv", "--without-pip", VENV])
        for wheel in wheels:
            host.install(f"/srv/gencode-wheels/{wheel.name}", wheel.read_bytes())
        host.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--disable-pip-version-check",
                  "--prefix", VENV, *[f"/srv/gencode-wheels/{w.name}" for w in wheels]])
    yield systems
    for name in ("trixie", "bookworm", "trixie-twin"):
        systems.hosts[name].run(["rm", "-rf", VENV, "/srv/gencode-wheels"])


def _plan(systems, tmp_path, target: str, capsys) -> tuple[int, list[dict]]:
    manifest = tmp_path / f"gencode-{target}.yaml"
    manifest.write_text(textwrap.dedent(f"""\
        version: 1
        donor: {{host: "{systems.hosts['trixie'].spec}", venv: {VENV}}}
        target: {{host: "{systems.hosts[target].spec}", venv: {VENV}}}
        ssh: {{identity_file: {systems.identity_file}, known_hosts: {systems.known_hosts}}}
        overlay: [svc]
        """))
    capsys.readouterr()
    code = main(["plan", str(manifest), "--json"])
    doc = json.loads(capsys.readouterr().out)
    return code, [f for f in doc["findings"] if f["code"] == "gencode-runtime-mismatch"]


def test_gencode_the_targets_runtime_refuses_blocks_and_the_twins_runtime_runs_it(hosts, tmp_path, capsys):
    code, [found] = _plan(hosts, tmp_path, "bookworm", capsys)
    assert found["severity"] == "error" and code == 3
    assert "generated for protobuf 5.27.0" in found["message"] and "protobuf 4.25.3" in found["message"]
    assert found["hint"].startswith("add 'protobuf' to overlay")
    code, clean = _plan(hosts, tmp_path, "trixie-twin", capsys)
    assert clean == [] and code == 0
