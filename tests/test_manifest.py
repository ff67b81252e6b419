"""Manifest validation: one message listing every problem, with key paths and fixes; nothing runs."""

from __future__ import annotations

import textwrap

import pytest

from transplant.errors import ManifestError
from transplant.controller.manifest_file import load_manifest
from transplant.core.manifest import normalize_pattern

GOOD = """\
version: 1
donor:  {host: root@ct129, venv: /root/venv_sglang}
target: {host: "root@ct200:2222", venv: /root/venv_sglang}
overlay: [torch, triton, "NVIDIA_*", sgl-kernel, sglang]
patches:
  - {source: patches/ddtree/, dest: sglang/srt/speculative/}
  - {source: patches/server_args.py, dest: sglang/srt/server_args.py}
verify:
  env: {CUDA_VISIBLE_DEVICES: 1}
  imports: [torch, sglang]
  server_args:
    entry: sglang.srt.server_args:prepare_server_args
    args: [--model-path, /dev/shm/Qwen3.6-27B, --speculative-algorithm, DFLASH]
    expect: {speculative_algorithm: DFLASH, speculative_num_draft_tokens: 16}
  smoke: {device: cuda}
"""


def write(tmp_path, text, patches=True):
    if patches:
        (tmp_path / "patches" / "ddtree").mkdir(parents=True)
        (tmp_path / "patches" / "ddtree" / "ddtree_utils.py").write_text("x = 1\n")
        (tmp_path / "patches" / "server_args.py").write_text("y = 2\n")
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(text))
    return path


def problems(tmp_path, text, patches=True):
    with pytest.raises(ManifestError) as info:
        load_manifest(write(tmp_path, text, patches))
    return info.value.problems


def test_good_manifest(tmp_path):
    m = load_manifest(write(tmp_path, GOOD))
    assert str(m.target.host) == "root@ct200:2222" and m.target.host.port == 2222
    assert m.overlay == ("torch", "triton", "nvidia-*", "sgl-kernel", "sglang")
    assert m.patches[0].dest == "sglang/srt/speculative/"
    assert m.verify.env == {"CUDA_VISIBLE_DEVICES": "1"}
    assert m.verify.server_args.expect["speculative_num_draft_tokens"] == 16
    assert m.verify.smoke_device == "cuda" and m.ssh.verify_host_keys is True


def test_every_problem_is_listed_with_key_path_and_fix(tmp_path):
    found = problems(tmp_path, """\
        version: 2
        donor: {host: "root@ct 129", venv: relative}
        target: {host: root@ct200, venv: /root/v, extra: 1}
        overlay: [torch, "a b"]
        patches:
          - {source: ../outside.py, dest: /etc/passwd}
        verify: {smoke: {device: tpu}, srv_args: 1}
        """)
    assert found == [
        "version: expected 1, got a number (2); fix: write version: 1 (the only manifest version)",
        "donor.host: bad host name 'ct 129' in 'root@ct 129'; fix: write \"local\" or [user@]host[:port], e.g. root@ct200:22",
        "donor.venv: expected an absolute path, got 'relative'; fix: start it with '/', e.g. /root/venv_sglang",
        "target.extra: unknown key; fix: remove it; allowed keys: host, venv, base, allow_shared_interpreter",
        "overlay[1]: 'a b' is not a distribution name or glob; fix: use letters, digits, '-', '_', '.' and the globs '*' and '?'",
        "patches[0].source: '../outside.py' is absolute or leaves the manifest's folder; fix: keep patch files in a folder beside the manifest and name them relative to it",
        "patches[0].dest: '/etc/passwd' is absolute or leaves site-packages; fix: name it relative to site-packages, e.g. sglang/srt/server_args.py",
        "verify.srv_args: unknown key; fix: did you mean 'server_args'?",
        "verify.smoke.device: expected one of cpu, cuda, auto, got the string 'tpu'; fix: write device: auto to use a GPU when there is one",
    ]


def test_message_names_the_file(tmp_path):
    with pytest.raises(ManifestError) as info:
        load_manifest(write(tmp_path, "version: 1\n", patches=False))
    text = str(info.value)
    assert text.startswith(f"{tmp_path / 'm.yaml'}: 3 problems; nothing was run:")
    assert "donor: missing; fix: add it: donor: {host: root@ct129, venv: /root/venv_sglang}" in text


def test_missing_patch_source_and_dest_escape(tmp_path):
    found = problems(tmp_path, GOOD.replace("patches/server_args.py, dest: sglang/srt/server_args.py",
                                            "patches/nope.py, dest: sglang/../../x.py"))
    assert found == [
        "patches[1].dest: 'sglang/../../x.py' is absolute or leaves site-packages; fix: name it relative to site-packages, e.g. sglang/srt/server_args.py",
    ]
    other = tmp_path / "b"
    other.mkdir()
    found = problems(other, GOOD.replace("patches/server_args.py", "patches/nope.py"))
    assert found == [f"patches[1].source: 'patches/nope.py' does not exist (looked in {tmp_path / 'b'}); fix: create it or correct the path"]


def test_yaml_syntax_error_names_line(tmp_path):
    found = problems(tmp_path, "version: 1\ndonor: [unclosed\n", patches=False)
    assert len(found) == 1 and found[0].startswith("(yaml): ") and "line 3" in found[0]


def test_a_character_yaml_refuses_is_placed_by_line_and_column(tmp_path):
    found = problems(tmp_path, "version: 1\ndonor:\n  host: local\x00\n", patches=False)
    assert found == ["(yaml): unacceptable character #x0000: special characters are not allowed at line 3, "
                     "column 14; fix: correct the YAML syntax there"]


def test_a_nel_yaml_folds_inside_a_quoted_path_is_refused_with_its_key(tmp_path):
    # PyYAML loads "/root/venv\x85x" as "/root/venv x": the manifest would name another folder
    import yaml
    assert yaml.safe_load('v: "/root/venv\x85x"')["v"] == "/root/venv x"
    text = GOOD.replace('venv: /root/venv_sglang}\noverlay', 'venv: "/root/venv\x85sglang"}\noverlay')
    assert text != GOOD
    found = problems(tmp_path, text)
    assert found == ["target.venv: holds the character U+0085 (NEL) at line 3, column 52, which YAML reads as a "
                     "line break (inside quotes PyYAML folds it into a space, so the value loaded would not be the "
                     "path written); fix: remove that character (rename the file or folder if its name holds it)"], found


@pytest.mark.parametrize("char,named", [("\x85", "U+0085 (NEL)"), ("\u2028", "U+2028 (LINE SEPARATOR)"),
                                        ("\u2029", "U+2029 (PARAGRAPH SEPARATOR)")])
def test_every_yaml_line_break_but_lf_and_cr_is_named_by_key_line_and_column(tmp_path, char, named):
    # one in a list item's value and one in a comment (which no key holds) are both named
    found = problems(tmp_path, GOOD.replace("patches/server_args.py,", f'"patches/server{char}args.py",')
                     + f"# a note{char}\n")
    assert [f.split(":", 1)[0] for f in found] == ["patches[1].source", "(yaml)"], found
    assert f"holds the character {named} at line 7, column 29" in found[0], found
    assert found[1] == (f"(yaml): the character {named} at line 16, column 9, which YAML reads as a line break; "
                        f"fix: remove that character"), found  # a comment: no value, no file to rename


def test_the_good_manifest_with_plain_non_ascii_loads(tmp_path):
    # the twin: other non-ASCII characters (an accent, a non-breaking space) are left to YAML as they were
    m = load_manifest(write(tmp_path, GOOD.replace("/root/venv_sglang}\noverlay", '"/root/venv_\u00e9\u00a0x"}\noverlay')))
    assert m.target.venv == "/root/venv_\u00e9\u00a0x"


def test_missing_file(tmp_path):
    with pytest.raises(ManifestError) as info:
        load_manifest(tmp_path / "absent.yaml")
    assert "not found" in info.value.problems[0]


def test_yaml_is_safe_loaded(tmp_path):
    found = problems(tmp_path, "!!python/object/apply:os.system ['echo hacked']\n", patches=False)
    assert found[0].startswith("(yaml): ")


def test_donor_equals_target(tmp_path):
    found = problems(tmp_path, GOOD.replace('"root@ct200:2222"', "root@ct129"))
    assert found == ["target: the target is the donor (root@ct129:/root/venv_sglang); fix: name another host or venv as the target"]


@pytest.mark.parametrize("given,normal", [("NVIDIA_*", "nvidia-*"), ("Flashinfer.Python", "flashinfer-python"),
                                          ("sgl__kernel", "sgl-kernel")])
def test_overlay_names_pep503(given, normal):
    assert normalize_pattern(given) == normal


def test_verify_serve_and_resolve(tmp_path):
    text = GOOD.replace("  smoke: {device: cuda}\n", """\
  smoke: {device: cuda}
  serve:
    command: ["{python}", -m, sglang.launch_server, --model-path, "{model}", --port, "{port}"]
    answer: choices.0.text
    timeout: 900
  skip_imports: [{name: build_backend, reason: "flashinfer's build helper, not a runtime module"}]
  python: "3.11"
""").replace("speculative_num_draft_tokens: 16}", "speculative_num_draft_tokens: 16}\n    resolve: true")
    m = load_manifest(write(tmp_path, text))
    serve = m.verify.serve
    assert serve.command == ("{python}", "-m", "sglang.launch_server", "--model-path", "{model}", "--port", "{port}")
    assert (serve.health, serve.path, serve.answer, serve.max_tokens, serve.timeout) == (
        "/health", "/generate", "choices.0.text", 4, 900.0)
    assert serve.body == {"input_ids": [1, 5, 7, 9], "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    assert m.verify.server_args.resolve is True
    assert m.verify.skip_imports == {"build_backend": "flashinfer's build helper, not a runtime module"}
    assert m.verify.python == "3.11"
    assert m.verify.overlay == m.overlay, "the overlay's distributions are what verify derives its checks from"


def test_bad_verify_serve_and_resolve_are_listed(tmp_path):
    found = problems(tmp_path, GOOD.replace("  smoke: {device: cuda}\n", """\
  smoke: {device: cuda}
  serve: {command: [], health: health, max_tokens: 0, body: [1], port: 1}
  skip_imports: [{name: "a-b", reason: x}, {name: y}]
  python: 3.10
""").replace("speculative_num_draft_tokens: 16}", "speculative_num_draft_tokens: 16}\n    resolve: yes please"))
    assert found == [
        "verify.server_args.resolve: expected true or false, got the string 'yes please'; fix: write resolve: true to run "
        "the framework's deeper resolution step too",
        "verify.serve.port: unknown key; fix: remove it; allowed keys: command, health, path, body, answer, max_tokens, "
        "config, timeout",
        "verify.serve.command: expected a non-empty list of strings, got an empty list; fix: write e.g. command: ['{python}', "
        "-m, sglang.launch_server, --model-path, '{model}', --port, '{port}']",
        "verify.serve.health: expected a URL path starting with /, got 'health'; fix: write e.g. /health",
        "verify.serve.body: expected a mapping, got a list; fix: write e.g. body: {input_ids: [1, 2]}",
        "verify.serve.max_tokens: expected a positive whole number, got a number (0); fix: write e.g. max_tokens: 4",
        "verify.skip_imports[0].name: expected an import name, got 'a-b'; fix: write e.g. transformers",
        "verify.skip_imports[1].reason: missing; fix: add it: reason: why",
        'verify.python: expected a version like "3.11", got a number (3.1); fix: write it quoted: python: "3.11"',
    ]


def test_verify_required_names_stages_the_donor_is_compared_in(tmp_path):
    m = load_manifest(write(tmp_path, GOOD + "  required: [imports, smoke, imports]\n"))
    assert m.verify.required == ("imports", "smoke")
    found = problems(tmp_path / "bad", GOOD + "  required: [imports, serve]\n")
    assert found == ["verify.required[1]: expected a stage the donor is compared in, got the string 'serve'; fix: name "
                     "stages of imports, native-load, server-args, smoke, e.g. required: [imports]"]
    assert problems(tmp_path / "bad2", GOOD + "  required: imports\n")[0].startswith(
        "verify.required: expected a list, got the string 'imports'")


def test_an_accept_entry_without_a_reason_gets_a_generic_example(tmp_path):
    found = problems(tmp_path, GOOD + "accept:\n  - {code: lockstep-mismatch, dists: [flashinfer-jit-cache]}\n")
    assert found == ["accept[0].reason: missing; fix: add it: reason: why this finding does not stop this target "
                     "(shown beside it)"], found
    assert "demo" not in " ".join(found) and "CPU build" not in " ".join(found)
    # the twin: with a reason it loads, and the reason is kept as written
    m = load_manifest(write(tmp_path / "ok", GOOD + "accept:\n  - {code: lockstep-mismatch, reason: no GPU here}\n"))
    assert [(a.code, a.reason) for a in m.accept] == [("lockstep-mismatch", "no GPU here")]


def test_an_import_entry_may_say_it_needs_a_gpu_and_nothing_else(tmp_path):
    m = load_manifest(write(tmp_path, GOOD.replace("imports: [torch, sglang]",
                                                   "imports: [torch, {name: deep_ep, needs: [gpu]}]")))
    assert m.verify.imports == ("torch", "deep_ep") and m.verify.needs == {"deep_ep": ("gpu",)}
    found = problems(tmp_path / "bad", GOOD.replace("imports: [torch, sglang]",
                                                    "imports: [{name: a, needs: [cpu]}, {needs: [gpu]}, {name: b-c}]"))
    assert found == ["verify.imports[0].needs: expected a list of gpu, got a list; fix: write needs: [gpu]",
                     "verify.imports[1].name: missing; fix: add it: name: deep_ep",
                     "verify.imports[2].name: expected an import name, got the string 'b-c'; fix: write e.g. flashinfer"]
