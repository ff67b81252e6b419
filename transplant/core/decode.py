"""One typed decoder for every document: decoded JSON or YAML trees into frozen dataclasses (pure core).

Every document transplant reads (the manifest, the probe's inventory, the ELF report, a saved
plan) goes through this module, and every error it raises or collects names the key path of
the bad value: ``donor.host``, ``distributions[3].record[12].size``, ``files['x.so'].needed``,
``plan.changes[0].copy[1].hash``. The model is packaging's ``packaging/pylock.py`` (its
``_get``/``_get_required``/``_get_sequence``/``_get_object`` helpers and the key path its
``PylockValidationError`` carries); the code is our own.

Three ways in, one per need:

* :class:`Decoder`: a dataclass target, read through :func:`typing.get_type_hints` (never the
  text of an annotation), compiled once per class: ``str``, ``int`` (a bool is not one),
  ``float``, ``bool``, ``X | None``, ``tuple[X, ...]`` from a list, ``Mapping[str, X]`` from
  an object, nested dataclasses, ``Any``; explicit per-field decoders for anything else
  (a :class:`~packaging.version.Version`, a field computed from several keys). It raises
  :class:`DecodeError` at the first bad value (the plan, the ELF report, parts of the inventory).
* :func:`member`: typed access to one key of an object, for documents whose wire shape is not
  the dataclass's (the probe's distributions and file entries).
* :class:`Problems`: collects every problem as ``key: what; fix: how`` instead of stopping at
  the first (the manifest, which a person writes and wants corrected in one go).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "DecodeError",
    "Decoder",
    "Problems",
    "FieldDecoder",
    "key_path",
    "item_path",
    "entry_path",
    "kind",
    "member",
    "strings",
]

#: A per-field decoder: ``(value, path, obj) -> decoded``; ``obj`` is the whole source object
#: (for a field computed from several keys); it raises :class:`DecodeError` naming ``path``.
FieldDecoder = Callable[[Any, str, Mapping[str, Any]], Any]

_NOTHING = object()


class DecodeError(ValueError):
    """A value that does not fit its place in a document.

    :ivar path: the key path (``distributions[3].record[0].size``; ``""`` for the document itself).
    :ivar problem: what is wrong when it is not a type (``missing``, ``unknown key``), else None.
    :ivar expected: what was expected (``int``, ``a list of strings``), with ``value`` what was found.
    """

    def __init__(self, path: str, expected: str | None = None, value: Any = _NOTHING, *,
                 problem: str | None = None) -> None:
        self.path, self.expected, self.value, self.problem = path, expected, value, problem
        super().__init__(f"{path or '(top level)'}: {self.describe()}")

    def describe(self, got: Callable[[Any], str] = repr) -> str:
        """``expected int, got '12'`` (``got`` renders the value; default :func:`repr`), or the problem."""
        if self.problem is not None:
            return self.problem
        return f"expected {self.expected}, got {got(self.value)}"

    def in_words(self) -> str:
        """:meth:`describe` for a person who never saw Python's type names: ``expected a string,
        got a whole number``; ``expected a whole number or null, got nothing (null)``."""
        if self.problem is not None:
            return self.problem
        expected = " or ".join(_TYPE_WORDS.get(part, part) for part in str(self.expected).split(" or "))
        return f"expected {expected}, got {_value_words(self.value)}"


#: Python's names of the JSON / YAML scalar types, as the messages say them.
_TYPE_WORDS = {"str": "a string", "int": "a whole number", "float": "a number", "bool": "true or false",
               "null": "null", "list": "a list", "dict": "an object"}


def _value_words(value: Any) -> str:
    """What kind of value was found, in words (``a string``, ``nothing (null)``, ``a list``)."""
    if value is None or value is _NOTHING:
        return "nothing (null)"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def key_path(parent: str, name: str) -> str:
    """``parent.name`` (just ``name`` at the top level)."""
    return f"{parent}.{name}" if parent else name


def item_path(parent: str, index: int) -> str:
    """``parent[index]``: an item of a list."""
    return f"{parent}[{index}]"


def entry_path(parent: str, name: Any) -> str:
    """``parent['name']``: a value of an object keyed by data (a file path, a symbol)."""
    return f"{parent}[{name!r}]"


def kind(value: Any) -> str:
    """A value as a person reads it in a message: ``nothing``, ``a boolean (True)``, ``a number (3)``,
    ``the string 'x'``, ``a list``, ``an empty list``, ``a mapping``, ``an empty mapping`` (else the
    type's name)."""
    if value is None:
        return "nothing"
    if isinstance(value, bool):
        return f"a boolean ({value})"
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"the string {value!r}"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    if isinstance(value, dict):
        return "a mapping" if value else "an empty mapping"
    return type(value).__name__


def _is(value: Any, types_: tuple[type, ...]) -> bool:
    """``isinstance`` where a bool is never an int or a float (JSON's ``true`` is not ``1``)."""
    return isinstance(value, types_) and (not isinstance(value, bool) or bool in types_)


def _names(types_: tuple[type, ...]) -> str:
    """``str``, ``int or null``: what a tuple of accepted types expects."""
    return " or ".join("null" if t is type(None) else t.__name__ for t in types_)


def member(obj: Any, name: str, path: str, types_: type | tuple[type, ...], *, optional: bool = False) -> Any:
    """``obj[name]`` checked against ``types_`` (a bool is not an int).

    :param path: the key path of ``obj`` (the error names ``path.name``).
    :param optional: a missing key or null is returned as None instead of failing.
    :raises DecodeError: ``obj`` is not an object (path ``path``), or the value is missing or
        of another type (path ``path.name``; expected the types' names).
    """
    if not isinstance(obj, dict):
        raise DecodeError(path, "an object", obj)
    value = obj.get(name)
    if value is None and optional:
        return None
    one = types_ if isinstance(types_, tuple) else (types_,)
    if not _is(value, one):
        raise DecodeError(key_path(path, name), _names(one), value)
    return value


def strings(value: Any, path: str) -> tuple[str, ...]:
    """A list of strings as a tuple; null is the empty tuple.

    :raises DecodeError: anything else (expected ``a list of strings``).
    """
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DecodeError(path, "a list of strings", value)
    return tuple(value)


# --- dataclass targets -------------------------------------------------------------------------

_Leaf = Callable[[Any, str], Any]


def _describe(tp: Any) -> str:
    """What a type expects, for messages: ``str``, ``int or null``, ``a list``, ``an object``."""
    args = typing.get_args(tp)
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return " or ".join(_describe(a) for a in inner) + (" or null" if len(inner) < len(args) else "")
    if origin is tuple:
        return "a list"
    if origin in (dict, Mapping) or tp in (dict, Mapping) or dataclasses.is_dataclass(tp):
        return "an object"
    return getattr(tp, "__name__", str(tp))


class Decoder:
    """Decodes an object into the dataclass ``cls`` (its fields' types read with
    :func:`typing.get_type_hints`), raising :class:`DecodeError` at the first bad value.

    :param unknown: ``"error"``: a key that is no field fails (``unknown key``); ``"ignore"``:
        such keys are skipped (a probe document may carry more than the model keeps).
    :param null_default: a null value of a field that has a default (and does not accept
        None) takes that default, as a missing key does.
    :param fields: field name -> :data:`FieldDecoder` replacing the type-driven decoding of
        that field (called only when the key is present and, with ``null_default``, not null).
    :param nested: a nested dataclass -> the :class:`Decoder` to use for it (default: one with
        the same ``unknown`` and ``null_default``).
    :raises TypeError: (when first used) a field's type is none of those listed in the module
        docstring and has no field decoder.
    """

    def __init__(self, cls: type, *, unknown: str = "error", null_default: bool = False,
                 fields: Mapping[str, FieldDecoder] | None = None,
                 nested: Mapping[type, Decoder] | None = None) -> None:
        if unknown not in ("error", "ignore"):
            raise ValueError(f"unknown={unknown!r}: expected 'error' or 'ignore'")
        self.cls, self.unknown, self.null_default = cls, unknown, null_default
        self.fields = dict(fields or {})
        self.nested = dict(nested or {})
        self._specs: list[tuple[str, Any, bool, bool, bool]] | None = None
        self._names: frozenset[str] = frozenset()

    def __call__(self, data: Any, path: str = "", /, **given: Any) -> Any:
        """Decode ``data`` (an object) at key path ``path``; ``given`` fields are set from the
        caller (not read from ``data``: a file's path that is the key it is listed under).

        :raises DecodeError: not an object, an unknown key (``unknown="error"``), a required
            key missing, a value of the wrong type, or the dataclass refusing the values
            (its ``__post_init__`` raising ValueError: the message names ``path``).
        """
        specs = self._specs if self._specs is not None else self._compile()
        if not isinstance(data, Mapping):
            raise DecodeError(path, "an object", data)
        if self.unknown == "error" and not self._names.issuperset(data):
            extra = sorted(str(k) for k in data if k not in self._names)
            raise DecodeError(key_path(path, extra[0]), problem="unknown key")
        values: dict[str, Any] = {}
        null_default = self.null_default
        for name, check, required, nullable, custom in specs:
            if name in given:
                values[name] = given[name]
                continue
            value = data.get(name, _NOTHING)
            if value is _NOTHING or (value is None and null_default and not required and not nullable):
                if required:
                    raise DecodeError(key_path(path, name), problem="missing")
                continue
            if custom:
                values[name] = check(value, key_path(path, name), data)
            elif type(check) is tuple:  # a scalar: checked here, the path built only on failure
                if value.__class__ not in check and not _is(value, check):
                    raise DecodeError(key_path(path, name), _names(check), value)
                values[name] = value
            else:
                values[name] = check(value, key_path(path, name))
        try:
            return self.cls(**values)
        except ValueError as exc:
            raise DecodeError(path, problem=str(exc)) from None

    def _compile(self) -> list[tuple[str, Any, bool, bool, bool]]:
        hints = typing.get_type_hints(self.cls)
        specs: list[tuple[str, Any, bool, bool, bool]] = []
        for f in dataclasses.fields(self.cls):
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            tp = hints[f.name]
            nullable = type(None) in typing.get_args(tp) or tp is Any
            if f.name in self.fields:
                specs.append((f.name, self.fields[f.name], required, nullable, True))
                continue
            scalar = _scalar(tp)
            specs.append((f.name, scalar if scalar is not None else self._leaf(tp), required, nullable, False))
        self._names = frozenset(f.name for f in dataclasses.fields(self.cls))
        self._specs = specs
        return specs

    def _leaf(self, tp: Any) -> _Leaf:
        """The decoder of a value of type ``tp`` (``(value, path) -> decoded``)."""
        scalar = _scalar(tp)
        if scalar is not None:
            def check(value: Any, path: str) -> Any:
                if value.__class__ not in scalar and not _is(value, scalar):
                    raise DecodeError(path, _names(scalar), value)
                return value
            return check
        if tp is Any:
            return lambda value, path: value
        if tp is float:
            def number(value: Any, path: str) -> float:
                if not _is(value, (int, float)):
                    raise DecodeError(path, "a number", value)
                return float(value)
            return number
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            inner = [a for a in args if a is not type(None)]
            if len(inner) != 1 or len(args) != 2:
                raise TypeError(f"{self.cls.__name__}: only X | None unions are decoded, not {tp}")
            one, what = self._leaf(inner[0]), _describe(tp)

            def optional(value: Any, path: str) -> Any:
                if value is None:
                    return None
                try:
                    return one(value, path)
                except DecodeError as exc:
                    if exc.path == path and exc.problem is None:
                        raise DecodeError(path, what, value) from None
                    raise
            return optional
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            item = _scalar(args[0])
            if item is not None:
                def scalars(value: Any, path: str) -> tuple:
                    if not isinstance(value, list):
                        raise DecodeError(path, "a list", value)
                    for i, v in enumerate(value):
                        if v.__class__ not in item and not _is(v, item):
                            raise DecodeError(item_path(path, i), _names(item), v)
                    return tuple(value)
                return scalars
            each = self._leaf(args[0])

            def sequence(value: Any, path: str) -> tuple:
                if not isinstance(value, list):
                    raise DecodeError(path, "a list", value)
                return tuple(each(v, item_path(path, i)) for i, v in enumerate(value))
            return sequence
        if origin in (dict, Mapping) and len(args) == 2 and args[0] is str:
            each = self._leaf(args[1])

            def mapping(value: Any, path: str) -> dict:
                if not isinstance(value, dict):
                    raise DecodeError(path, "an object", value)
                out = {}
                for k, v in value.items():
                    if not isinstance(k, str):
                        raise DecodeError(entry_path(path, k), problem="expected a string key")
                    out[k] = each(v, entry_path(path, k))
                return out
            return mapping
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            inner_decoder = self.nested.get(tp) or Decoder(tp, unknown=self.unknown, null_default=self.null_default,
                                                          nested=self.nested)
            self.nested.setdefault(tp, inner_decoder)
            return lambda value, path: inner_decoder(value, path)
        raise TypeError(f"{self.cls.__name__}: no decoder for the type {tp!r}; give a field decoder")


def _scalar(tp: Any) -> tuple[type, ...] | None:
    """The accepted types of a scalar field (``str``, ``int``, ``bool``, and those or None), else None."""
    if tp in (str, int, bool):
        return (tp,)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1 and inner[0] in (str, int, bool) and len(args) == 2:
            return (inner[0], type(None))
    return None


# --- collecting problems -----------------------------------------------------------------------

class Problems:
    """Collects every problem of a document a person writes, each as ``key: what; fix: how``.

    Key paths as :func:`key_path` and :func:`item_path` write them; a key's unprintable
    characters are escaped (``\\n``) so a line never breaks.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __bool__(self) -> bool:
        return bool(self.lines)

    def add(self, key: str, message: str, fix: str) -> None:
        """Record one problem at ``key`` (``(top level)`` for the document itself)."""
        safe = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in key)
        self.lines.append(f"{safe}: {message}; fix: {fix}")

    def mapping(self, value: Any, key: str, allowed: Mapping[str, str], required: tuple[str, ...] = ()) -> dict:
        """``value`` as an object whose keys are those of ``allowed`` (key -> an example line,
        used in fixes); an unknown key gets a did-you-mean fix, a missing ``required`` key
        its example. Returns ``{}`` (and records a problem) when ``value`` is not an object."""
        if not isinstance(value, dict):
            self.add(key or "(top level)", f"expected a mapping, got {kind(value)}",
                     f"write it as 'key: value' lines with the keys {', '.join(allowed)}")
            return {}
        for name in value:
            if name not in allowed:
                close = difflib.get_close_matches(str(name), list(allowed), n=1)
                fix = f"did you mean {close[0]!r}?" if close else f"remove it; allowed keys: {', '.join(allowed)}"
                self.add(key_path(key, str(name)), "unknown key", fix)
        for name in required:
            if name not in value:
                self.add(key_path(key, name), "missing", f"add it: {allowed[name]}")
        return value

    def string(self, value: Any, key: str, fix: str) -> str | None:
        """A non-empty string without NUL, or None (and a problem)."""
        if isinstance(value, str) and "\0" in value:
            self.add(key, "contains a NUL character", fix)
            return None
        if isinstance(value, str) and value.strip():
            return value
        self.add(key, f"expected a non-empty string, got {kind(value)}", fix)
        return None
