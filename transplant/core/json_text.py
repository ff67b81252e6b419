"""JSON text of large documents, fast (pure core): ``json.dump(obj, f, indent=2, sort_keys=True)``'s
exact text, handed out in chunks of a few hundred KB.

``json.dump`` with ``indent`` runs the standard library's pure-Python encoder, one generator per
level and one ``write`` per token: for a large plan (tens of MB of text) that is several times
slower than building the same text in pieces, and slower still to a redirected standard output.
:func:`dump_indented` builds the
same text from lists joined per chunk (strings through the C ``encode_basestring_ascii``), so the
caller's ``write`` is called a few hundred times and the text is never held whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from json.encoder import encode_basestring_ascii
from typing import Any

__all__ = ["dump_indented"]

_CHUNK = 8192  # pieces joined per write: a few hundred KB of text


def _float(value: float) -> str:
    """As ``json``'s ``floatstr`` with ``allow_nan``."""
    if value != value:
        return "NaN"
    if value == float("inf"):
        return "Infinity"
    if value == float("-inf"):
        return "-Infinity"
    return float.__repr__(value)


def _key(key: Any) -> str:
    """A dict key as ``json`` writes it (before quoting): str as is, float, bool, None and int
    spelled as values are.

    :raises TypeError: another type, with ``json``'s message.
    """
    if isinstance(key, str):
        return key
    if isinstance(key, float):
        return _float(key)
    if key is True:
        return "true"
    if key is False:
        return "false"
    if key is None:
        return "null"
    if isinstance(key, int):
        return int.__repr__(key)
    raise TypeError(f"keys must be str, int, float, bool or None, not {key.__class__.__name__}")


def dump_indented(obj: Any, write: Callable[[str], object], indent: int = 2, *,
                  fields: Mapping[type, Sequence[str]] | None = None) -> None:
    """Write ``json.dumps(obj, indent=indent, sort_keys=True)``'s text (ASCII, ``NaN`` allowed, no
    trailing newline) through ``write``, in consecutive pieces whose concatenation is exactly that.

    :param write: called with each piece (a file's ``write``).
    :param fields: ``{class: attribute names}``: an object of exactly such a class is written as
        the dict ``{name: getattr(obj, name)}`` of those names would be (a dataclass as its
        ``to_dict`` gives it, without building that tree first: the real pair's plan is 66,800
        such objects). None (the default) writes only JSON's own types.
    :raises TypeError: a value of a type ``json`` cannot write (dicts, lists, tuples, str, int,
        float, bool and None only), or keys that cannot be sorted together, as ``json.dump``
        raises; what was written before stays written, as with ``json.dump``.
    :raises ValueError: a circular reference.
    """
    parts: list[str] = []
    add = parts.append
    seen: set[int] = set()
    names = {cls: sorted(attributes) for cls, attributes in (fields or {}).items()}
    # (class, level) -> [(text before the value, attribute, that text and null)]: the opening, the
    # newline and the quoted key
    keyed: dict[tuple[type, int], list[tuple[str, str, str]]] = {}

    def obj_keys(cls: type, level: int) -> list[tuple[str, str, str]]:
        newline = "\n" + " " * (indent * (level + 1))
        befores = [("{" if i == 0 else ",") + newline + encode_basestring_ascii(name) + ": "
                   for i, name in enumerate(names[cls])]
        out = keyed[(cls, level)] = [(before, name, before + "null") for before, name in zip(befores, names[cls], strict=True)]
        return out

    def instance(o: Any, level: int) -> None:
        """An object of a class in ``fields``: its attributes as a dict's items, sorted by name."""
        keys = keyed.get((type(o), level)) or obj_keys(type(o), level)
        if not keys:
            add("{}")
            return
        for before, name, null in keys:
            item = getattr(o, name)
            kind = type(item)  # the common scalars at once; the rest through value()
            if kind is str:
                add(before + encode_basestring_ascii(item))
            elif item is None:
                add(null)
            elif kind is int:
                add(before + int.__repr__(item))
            else:
                add(before)
                value(item, level + 1)
        add("\n" + " " * (indent * level) + "}")

    def flush() -> None:
        if len(parts) >= _CHUNK:
            write("".join(parts))
            parts.clear()

    def value(o: Any, level: int) -> None:
        if type(o) in names:
            instance(o, level)
            flush()
        elif isinstance(o, str):
            add(encode_basestring_ascii(o))
        elif o is None:
            add("null")
        elif o is True:
            add("true")
        elif o is False:
            add("false")
        elif isinstance(o, int):
            add(int.__repr__(o))
        elif isinstance(o, float):
            add(_float(o))
        elif isinstance(o, (list, tuple, dict)):
            if not o:
                add("{}" if isinstance(o, dict) else "[]")
                return
            if id(o) in seen:
                raise ValueError("Circular reference detected")
            seen.add(id(o))
            newline = "\n" + " " * (indent * (level + 1))
            if isinstance(o, dict):
                opening, closing = "{", "}"
                for key, item in sorted(o.items()):
                    add(opening + newline + encode_basestring_ascii(_key(key)) + ": ")
                    opening = ","
                    value(item, level + 1)
            else:
                opening, closing = "[", "]"
                for item in o:
                    add(opening + newline)
                    opening = ","
                    value(item, level + 1)
            add("\n" + " " * (indent * level) + closing)
            seen.discard(id(o))
            flush()
        else:
            raise TypeError(f"Object of type {o.__class__.__name__} is not JSON serializable")

    value(obj, 0)
    if parts:
        write("".join(parts))
