"""``dump_indented`` writes exactly ``json.dumps(obj, indent=2, sort_keys=True)``'s text, in pieces."""

from __future__ import annotations

import json

import pytest

from transplant.core import json_text
from transplant.core.json_text import dump_indented

DOCUMENTS = [
    {}, [], "", 0, -1.5, None, True, "é\u2028\x00\"\\/\t", 10 ** 30, float("nan"), float("inf"), -float("inf"), 1e-7,
    {"b": [1, 2.5, {"x": None, "a": []}], "a": {"z": {}, "y": (True, False)}, "c": "ünï\ncode \U0001f600"},
    {1: "int key", 2: 3},
    {"nested": [[[[]]], [{}], [{"k": [1, {"deep": "x" * 40}]}]]},
    [{"path": f"lib/python3.11/site-packages/p/m{i}.py", "size": i, "hash": None} for i in range(3000)],
]


@pytest.mark.parametrize("document", DOCUMENTS)
def test_the_text_is_that_of_json_dumps(document, monkeypatch) -> None:
    monkeypatch.setattr(json_text, "_CHUNK", 7)  # many pieces: the joints are checked too
    pieces: list[str] = []
    dump_indented(document, pieces.append)
    assert "".join(pieces) == json.dumps(document, indent=2, sort_keys=True)
    assert all(pieces)


def test_what_json_refuses_is_refused() -> None:
    circular: list = []
    circular.append(circular)
    for document, error in (({"a": {1, 2}}, TypeError), ({("t",): 1}, TypeError), ({1: 1, "a": 2}, TypeError),
                            (circular, ValueError)):
        with pytest.raises(error):
            json.dumps(document, indent=2, sort_keys=True)
        with pytest.raises(error):
            dump_indented(document, lambda text: None)
