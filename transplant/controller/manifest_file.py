"""The manifest file: YAML read strictly (a key given twice is refused), bounded, then validated
by :func:`transplant.core.manifest.parse_manifest` and its patch sources checked on disk (edge)."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from transplant.controller.regular_file import NotRegular, read_regular
from transplant.errors import ManifestError
from transplant.core.manifest import Manifest, parse_manifest

__all__ = ["MAX_MANIFEST_BYTES", "load_manifest"]


#: the largest manifest read (bytes): a real one is a few KiB; YAML takes minutes over tens of MiB
MAX_MANIFEST_BYTES = 1 << 20


class _DuplicateKey(Exception):
    pass


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (YAML 1.2 says keys are unique)."""

    def construct_mapping(self, node, deep=False):  # PyYAML's signature
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, (str, int, float, bool, type(None))):
                mark = key_node.start_mark
                raise _DuplicateKey(f"(yaml): a key that is a {type(key).__name__} (line {mark.line + 1}, "
                                    f"column {mark.column + 1}); fix: write plain names as keys (a '? [a, b]' "
                                    f"complex key is not part of a manifest)")
            if key in seen:
                mark = key_node.start_mark
                raise _DuplicateKey(f"(yaml): the key {key!r} is given twice (line {mark.line + 1}); "
                                    f"fix: keep one of them")
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _looks_like_location(text: str) -> bool:
    """Whether a path that does not exist reads as ``HOST:VENV`` (``local:/srv/venv``,
    ``root@gpu-07:/root/venv``, ``root@127.0.0.11:2222:/srv/venv`` as transplant prints it): a
    host without a slash, then a colon and an absolute path."""
    host, sep, venv = text.partition(":/")
    return bool(sep and host and "/" not in host)


def _reader_where(text: str, exc: yaml.YAMLError) -> str:
    """Where a PyYAML error without a mark happened: its ``position`` (a character offset into
    ``text``, what ``yaml.reader.ReaderError`` gives for a character YAML does not accept, such as
    a NUL byte) as "line L, column C"; "an unknown place" when it has none."""
    position = getattr(exc, "position", None)
    if not isinstance(position, int) or not 0 <= position <= len(text):
        return "an unknown place"
    line_start = text.rfind("\n", 0, position) + 1
    return f"line {text.count(chr(10), 0, position) + 1}, column {position - line_start + 1}"


#: Characters YAML 1.1 (PyYAML's) reads as line breaks besides LF and CR, with what each does: inside
#: a quoted value PyYAML folds NEL into a space, so the value loaded is not the one written (nothing
#: in PyYAML turns that off); outside quotes each one is a syntax error ("while scanning a simple key").
LINE_BREAKS = {
    "\x85": ("U+0085 (NEL)", "inside quotes PyYAML folds it into a space, so the value loaded would not be the "
                             "path written"),
    "\u2028": ("U+2028 (LINE SEPARATOR)", "a syntax error outside quotes, and a value YAML readers disagree on"),
    "\u2029": ("U+2029 (PARAGRAPH SEPARATOR)", "a syntax error outside quotes, and a value YAML readers disagree on"),
}


def _key_at(text: str, position: int) -> str | None:
    """The key path (``target.venv``, ``patches[0].source``) of the value holding the character at
    ``position`` of ``text``, from PyYAML's composed nodes (of the text with every such line break
    made a plain character, so that the positions stay and one break elsewhere cannot hide the
    key); None when the text does not compose or the character is in no value (a key, a comment)."""
    try:
        node = yaml.compose(text.translate({ord(c): "_" for c in LINE_BREAKS}), Loader=yaml.SafeLoader)
    except (yaml.YAMLError, RecursionError):
        return None
    path = ""
    while node is not None:
        if isinstance(node, yaml.ScalarNode):
            return path or None
        inside = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if value.start_mark.index <= position < max(value.end_mark.index, value.start_mark.index + 1):
                    name = key.value if isinstance(key, yaml.ScalarNode) else "?"
                    inside, path = value, f"{path}.{name}" if path else str(name)
                    break
        elif isinstance(node, yaml.SequenceNode):
            for i, value in enumerate(node.value):
                if value.start_mark.index <= position < max(value.end_mark.index, value.start_mark.index + 1):
                    inside, path = value, f"{path}[{i}]"
                    break
        node = inside
    return None


def _line_breaks(text: str) -> list[str]:
    """One problem per character of :data:`LINE_BREAKS` in ``text``: where it is (the key when it
    is in a value, the line and column) and the fix."""
    problems = []
    for position, char in enumerate(text):
        if char not in LINE_BREAKS:
            continue
        line_start = text.rfind("\n", 0, position) + 1
        where = f"line {text.count(chr(10), 0, position) + 1}, column {position - line_start + 1}"
        key = _key_at(text, position)
        named, effect = LINE_BREAKS[char]
        if key is None:  # in a key or a comment: no path to rename
            problems.append(f"(yaml): the character {named} at {where}, which YAML reads as a line break; "
                            f"fix: remove that character")
            continue
        problems.append(f"{key}: holds the character {named} at {where}, which YAML reads as a line "
                        f"break ({effect}); fix: remove that character (rename the file or folder if its name "
                        f"holds it)")
    return problems


def load_manifest(path: str | os.PathLike) -> Manifest:
    """Read, safe-load and validate a manifest; check that every patch source exists.

    :raises ManifestError: unreadable file, not a regular file (a FIFO is not waited on),
        over :data:`MAX_MANIFEST_BYTES`, YAML syntax error (with line and column), a key
        that is not a scalar, a character YAML reads as a line break besides LF and CR
        (:data:`LINE_BREAKS`, named with its key, line and column), or any validation problem; nothing else has run when it is raised.
    """
    name = str(path)
    try:
        text = read_regular(path, MAX_MANIFEST_BYTES).decode("utf-8")
    except FileNotFoundError:
        if _looks_like_location(name):
            raise ManifestError(name, ["(file): not found, and this command takes a manifest, not HOST:VENV; fix: "
                                       "give the path of the manifest that names this target (HOST:VENV is taken "
                                       "by plan/apply/verify --target, status, history, rollback, inventory, init and clone)"]) from None
        raise ManifestError(name, ["(file): not found; fix: give the path of an existing manifest, "
                                   "e.g. manifests/seed-migration.yaml"]) from None
    except NotRegular as exc:
        raise ManifestError(name, [f"(file): {exc}; fix: give the path of the manifest file itself "
                                   f"(a YAML file of at most {MAX_MANIFEST_BYTES // 1024} KiB)"]) from None
    except UnicodeDecodeError as exc:
        raise ManifestError(name, [f"(file): not a text file (byte {exc.start} is not UTF-8); fix: give the "
                                   f"manifest, a YAML text file (UTF-8), not a binary or another encoding"]) from None
    except OSError as exc:
        raise ManifestError(name, [f"(file): cannot be read ({exc}); fix: check the path and permissions"]) from None
    breaks = _line_breaks(text) if any(c in text for c in LINE_BREAKS) else []
    if breaks:
        raise ManifestError(name, breaks)
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise ManifestError(name, ["(yaml): nested too deeply; fix: a manifest needs at most a few levels"]) from None
    except _DuplicateKey as exc:
        raise ManifestError(name, [str(exc)]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else _reader_where(text, exc)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ManifestError(name, [f"(yaml): {problem} at {where}; fix: correct the YAML syntax there"]) from None
    if isinstance(data, dict) and str(data.get("schema", "")).startswith("transplant.plan/"):
        planned = data.get("manifest") if isinstance(data.get("manifest"), str) else "its 'manifest' key"
        raise ManifestError(name, [f"(file): this is a saved plan ({data['schema']}), not a manifest; fix: apply "
                                   f"takes it (transplant apply {name}); plan and verify take the manifest it was "
                                   f"planned from ({planned})"])
    manifest = parse_manifest(data, path=name)
    base = Path(path).resolve().parent
    problems = []
    for i, patch in enumerate(manifest.patches):
        source = base / patch.source
        if not source.exists():
            problems.append(f"patches[{i}].source: {patch.source!r} does not exist (looked in {base}); "
                            f"fix: create it or correct the path")
        elif patch.source.endswith("/") and not source.is_dir():
            problems.append(f"patches[{i}].source: {patch.source!r} is not a folder; fix: drop the trailing '/'")
        elif base not in source.resolve().parents:
            problems.append(f"patches[{i}].source: {patch.source!r} resolves outside {base} (a symlink); "
                            f"fix: copy the file beside the manifest")
    if problems:
        raise ManifestError(name, problems)
    return manifest
