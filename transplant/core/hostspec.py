"""Host addresses as a manifest or command line writes them (pure core).

``local`` names the controller itself; anything else is ``[user@]host[:port]``, with
IPv6 literals in brackets (``root@[::1]:2222``), as OpenSSH's ``ssh://`` URIs write them; that
URI itself (``ssh://root@gpu-07:2222``) is read too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["HostSpec", "LOCAL", "FORMS"]

#: The host forms transplant reads, as its messages name them.
FORMS = "write local, [user@]host[:port] or ssh://[user@]host[:port]"

# matched whole (fullmatch): ``$`` would also match before a final newline ("root\n")
_USER = re.compile(r"[A-Za-z0-9._][A-Za-z0-9._-]*")
_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?")
_IPV6 = re.compile(r"[0-9A-Fa-f:.]+")


@dataclass(frozen=True, kw_only=True)
class HostSpec:
    """Where a venv lives: the controller (``local``) or an SSH host.

    :ivar hostname: the host name or address; ``"local"`` for the controller.
    :ivar user: login name, or None for the SSH default (the controller's user).
    :ivar port: TCP port, or None for the SSH default (22).
    """

    hostname: str
    user: str | None = None
    port: int | None = None

    @property
    def is_local(self) -> bool:
        """True for the controller itself."""
        return self.hostname == "local" and self.user is None and self.port is None

    def __str__(self) -> str:
        if self.is_local:
            return "local"
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        user = f"{self.user}@" if self.user else ""
        port = f":{self.port}" if self.port is not None else ""
        return f"{user}{host}{port}"

    @classmethod
    def parse(cls, text: str) -> HostSpec:
        """Parse ``local``, ``[user@]host[:port]`` or ``ssh://[user@]host[:port]`` (OpenSSH's URL form).

        :raises ValueError: the text is empty, has spaces or shell characters, a bad
            user or host name, or a port outside 1..65535, ``local`` in another case (did you
            mean ``local``), a ``HOST:/path`` location or a URL with a path where a host alone belongs,
            or a URL of another scheme than ``ssh``; the message says which (and the accepted forms).
        """
        if not isinstance(text, str) or not text.strip():
            raise ValueError("expected 'local' or [user@]host[:port], got an empty value")
        if text == "local":
            return cls(hostname="local")
        if text.strip().lower() == "local":
            raise ValueError(f"{text!r} is not a host name; did you mean 'local' (the controller, in lower case)?")
        scheme, sep, rest = text.partition("://")
        if sep and "/" not in scheme and "@" not in scheme:  # a URL: OpenSSH's ssh:// form is read as one
            if scheme.lower() != "ssh":
                raise ValueError(f"{text!r}: transplant reaches hosts over ssh only; {FORMS}")
            authority, slash, path = rest.partition("/")
            if path:
                raise ValueError(f"{text!r} holds a venv path; the host is 'ssh://{authority}' alone and the path "
                                 f"goes in 'venv' (host: ssh://{authority}, venv: /{path})")
            if authority.lower() == "local":
                raise ValueError(f"{text!r}: the controller is written local, without ssh://")
            if not authority:
                raise ValueError(f"{text!r} names no ssh host; {FORMS}")
            return cls.parse(authority)
        head, slash, path = text.partition(":/")
        if slash:
            raise ValueError(f"{text!r} holds a venv path; the host is {head!r} alone and the path goes in 'venv' "
                             f"(host: {head}, venv: /{path})")
        user, at, rest = text.rpartition("@")
        if at and not _USER.fullmatch(user):
            raise ValueError(f"bad user name {user!r} in {text!r}")
        port_text = None
        if rest.startswith("["):
            host, bracket, tail = rest[1:].partition("]")
            if not bracket or not _IPV6.fullmatch(host):
                raise ValueError(f"bad IPv6 address in {text!r}; write it as [addr] or [addr]:port")
            if tail:
                if not tail.startswith(":"):
                    raise ValueError(f"unexpected {tail!r} after the address in {text!r}")
                port_text = tail[1:]
        else:
            host, colon, port_text = rest.partition(":")
            if not colon:
                port_text = None
            if not _NAME.fullmatch(host):
                raise ValueError(f"bad host name {host!r} in {text!r}")
        port = None
        if port_text is not None:
            if not re.fullmatch(r"[0-9]{1,5}", port_text) or not 1 <= int(port_text) <= 65535:
                raise ValueError(f"bad port {port_text!r} in {text!r}; expected 1..65535")
            port = int(port_text)
        return cls(hostname=host, user=user or None, port=port)


LOCAL = HostSpec(hostname="local")
