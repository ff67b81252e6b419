"""recover --from rebuilds the sum of every transaction since the base: a patch an earlier
transaction applied is on the recovered venv too. Local venvs from real wheels."""

from __future__ import annotations

import shutil
import textwrap

import pytest

from transplant.cli.app import main
from transplant.lab.wheels import build_wheel, make_venv
from transplant.recover.recipesum import sum_recipes

SITE = "lib/python3.11/site-packages"


def test_sum_of_recipes_keeps_what_earlier_transactions_brought():
    first = {"manifest": {"overlay": ["alpha", "gone"], "remove": ["gamma"],
                          "patches": [{"source": "p/x.py", "dest": "alpha/x.py"}]},
             "patches": [{"local": "p/x.py", "dest": "alpha/x.py", "venv_path": f"{SITE}/alpha/x.py", "hash": "h1"}]}
    second = {"manifest": {"overlay": ["beta"], "remove": ["gone"], "verify": {"imports": ["beta"]}}, "patches": []}
    summed = sum_recipes([("t1", first), ("t2", second)])
    m = summed["manifest"]
    assert m["overlay"] == ["beta", "alpha"], "alpha from t1 stays; 'gone', which t2 removed, does not come back"
    assert m["remove"] == ["gone", "gamma"] and m["verify"] == {"imports": ["beta"]}
    assert m["patches"] == [{"source": "earlier/t1/p/x.py", "dest": "alpha/x.py"}]
    assert summed["patches"][0]["local"] == "earlier/t1/p/x.py" and summed["summed"] == ["t1", "t2"]
    assert sum_recipes([("t2", second)])["manifest"] == second["manifest"], "one transaction: its own recipe"


@pytest.mark.parametrize("same_second", [False, True], ids=["ids-as-made", "one-second-suffixes-backwards"])
def test_recover_from_history_rebuilds_every_transaction(tmp_path, capsys, monkeypatch, same_second):
    monkeypatch.setenv("TRANSPLANT_STATE_DIR", str(tmp_path / "state"))
    if same_second:
        # two applies in one second: ids hold the second and a random suffix, and here the newer
        # one's suffix sorts first; the applier lists them in the order they began
        from txids import script_transaction_ids

        script_transaction_ids(monkeypatch, ["20260101T000000Z-ffffffff", "20260101T000000Z-00000000"])
    wheels = tmp_path / "wheels"
    alpha2 = build_wheel(wheels, "alpha", "2.0", {"alpha/__init__.py": "V = 2\n"})
    alpha1 = build_wheel(wheels / "old", "alpha", "1.0", {"alpha/__init__.py": "V = 1\n"})
    beta = build_wheel(wheels, "beta", "1.0", {"beta/__init__.py": "B = 1\n"})
    donor = make_venv(tmp_path / "donor", [alpha2, beta])
    pristine = make_venv(tmp_path / "pristine", [alpha1])
    source, fresh = tmp_path / "source", tmp_path / "fresh"
    for venv in (source, fresh):
        shutil.copytree(pristine, venv, symlinks=True)
    (tmp_path / "patches").mkdir()
    (tmp_path / "patches" / "tuned.py").write_text("TUNED = 15\n")

    def manifest(name: str, overlay: str, extra: str = "") -> str:
        path = tmp_path / f"{name}.yaml"
        path.write_text(textwrap.dedent(f"""\
            version: 1
            donor: {{host: local, venv: {donor}}}
            target: {{host: local, venv: {source}}}
            overlay: [{overlay}]
            """) + extra)
        return str(path)

    first = manifest("first", "alpha", "patches:\n  - {source: patches/tuned.py, dest: alpha/tuned.py}\n")
    assert main(["apply", first, "--yes"]) == 0
    second = manifest("second", "beta", "verify: {imports: [beta]}\n")
    assert main(["apply", second, "--yes", "--verify"]) == 0
    capsys.readouterr()
    assert main(["recover", "--from", f"local:{source}", "--target", f"local:{fresh}", "--yes"]) == 0
    said = capsys.readouterr().out
    rules = [line for line in said.splitlines() if "recover: " in line and "─" in line]
    assert len(rules) == 4 and all(len(line) <= 100 for line in rules), "a pipe's separators stay a line wide"
    out = " ".join(said.split())
    assert "with what the 1 earlier transaction " in out, out
    site = fresh / SITE
    assert (site / "alpha" / "tuned.py").read_text() == "TUNED = 15\n", "the first transaction's patch is there"
    assert (site / "alpha" / "__init__.py").read_text() == "V = 2\n" and (site / "beta" / "__init__.py").exists()
