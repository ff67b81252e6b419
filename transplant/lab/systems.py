"""Lab hosts with systems of their own: a Debian root (its glibc, Python, libraries) per host.

A :class:`SystemHost` runs its sshd chrooted into an overlay of a cached Debian root
(:mod:`transplant.lab.roots`), inside ``unshare --mount --uts --pid --fork`` with private mount
propagation, so every mount it makes (the overlay, ``/srv``, ``/proc``, ``/dev``, ``/run``,
``/tmp``, the read-only binds) exists only in its namespace and goes with its last process:
``findmnt`` on the controller never shows one, and removing the host's folder afterwards
removes only that folder. A host's own changes land in its overlay's upper folder; the cached
root is never written.

Layout of a system host's folder (beside what :class:`~transplant.lab.hosts.LabHost` keeps)::

    upper/ work/     the overlay's upper and work folders (this host's changes to its system)
    merged/          where the overlay is mounted, inside the host's namespace only
    lab/             host key, authorized_keys and sshd_config, bound read-only at /lab inside
    srv/             the host's /srv, as for every lab host
    proc-driver/     when present, bound over /proc/driver (a driver stand-in's nvidia/version)
    cpuinfo          when present, bound over /proc/cpuinfo (a CPU stand-in's flags)

Stand-ins for what this machine cannot have are files placed where the real thing lives on a
host, through :meth:`SystemHost.install` (inside the root) or a bind of ``binds`` (read-only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from transplant.errors import TransplantError
from transplant.lab.hosts import Lab, LabHost, sshd_config
from transplant.lab.roots import build_root

__all__ = ["SystemHost", "SystemLab"]

#: Mount what the host needs inside its namespace, then run the command chrooted (``$@``).
#: Arguments: root, host folder, host name, then ``SRC DEST`` pairs of read-only binds up to
#: ``--``, then the command.
_START_SCRIPT = r"""set -e
root=$1 folder=$2 name=$3
shift 3
m=$folder/merged
mount -t overlay overlay -o "lowerdir=$root,upperdir=$folder/upper,workdir=$folder/work" "$m"
mkdir -p "$m/srv" "$m/lab" "$m/proc" "$m/dev" "$m/run" "$m/tmp"
mount --bind "$folder/srv" "$m/srv"
mount -o bind,ro "$folder/lab" "$m/lab"
mount -t proc proc "$m/proc"
if [ -d "$folder/proc-driver" ] && [ -d "$m/proc/driver" ]; then mount --bind "$folder/proc-driver" "$m/proc/driver"; fi
if [ -f "$folder/cpuinfo" ]; then mount --bind "$folder/cpuinfo" "$m/proc/cpuinfo"; fi
mount --rbind /dev "$m/dev"
mount -t tmpfs -o mode=0755 tmpfs "$m/run"
mkdir -p "$m/run/sshd"
mount -t tmpfs -o mode=1777 tmpfs "$m/tmp"
while [ "$1" != -- ]; do
  if [ -d "$1" ]; then mkdir -p "$m$2"; else mkdir -p "$(dirname "$m$2")"; [ -e "$m$2" ] || : > "$m$2"; fi
  mount -o bind,ro "$1" "$m$2"
  shift 2
done
shift
hostname "$name"
cd "$m"
exec chroot "$m" "$@"
"""

def _plain_path(text: str, what: str) -> str:
    """``text`` when it is an absolute path the start script and overlay options take as is."""
    if not text.startswith("/") or any(c in text for c in ",:\n\0") or "/../" in text + "/":
        raise ValueError(f"{what} {text!r} must be an absolute path without ',', ':' or '..'")
    return text


class SystemHost(LabHost):
    """A lab host whose sshd runs chrooted in an overlay of a Debian root.

    :ivar release: the Debian release of its root (``bookworm``).
    :ivar system_root: the cached root, the overlay's read-only lower layer.
    :ivar binds: ``{controller path: path inside}`` bound read-only into the host (a Python
        build shared by two hosts, a stand-in file over ``/proc/cpuinfo``).
    """

    def __init__(self, name: str, address: str, port: int, folder: Path, sshd_config: Path, *,
                 release: str, system_root: Path, binds: Mapping[str, str] | None = None) -> None:
        super().__init__(name, address, port, folder, sshd_config)
        self.release = release
        self.system_root = Path(_plain_path(str(system_root), "system root"))
        _plain_path(str(folder), "lab host folder")
        self.binds = {_plain_path(src, "bind source"): _plain_path(dest, "bind target")
                      for src, dest in (binds or {}).items()}
        for sub in ("upper", "work", "merged", "lab", "srv"):
            (folder / sub).mkdir(parents=True, exist_ok=True)

    def _prefix(self, command: Sequence[str]) -> list[str]:
        pairs = [part for src, dest in self.binds.items() for part in (src, dest)]
        return [
            "unshare", "--mount", "--uts", "--pid", "--fork", "--propagation", "private", "--",
            "sh", "-c", _START_SCRIPT, "sh", str(self.system_root), str(self.folder), self.name,
            *pairs, "--", *command,
        ]  # fmt: skip

    def _start_command(self, sshd: str, config: Path) -> list[str]:
        return self._prefix(["/usr/sbin/sshd", "-D", "-e", "-f", "/lab/sshd_config"])

    def _session_pid(self) -> int:
        """The chrooted process at the top of the host's pid namespace (the unshare process
        that :meth:`start_sshd` started forks it)."""
        assert self.pid is not None
        children = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split()
        if not children:
            raise TransplantError(f"lab host {self.name}: its sshd is not running")
        return int(children[0])

    def _command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as root inside the host's system (its root, namespaces and mounts); while
        stopped, in a fresh set of the same mounts (:meth:`LabHost.run` runs it)."""
        if self.pid is not None:
            return ["nsenter", "--target", str(self._session_pid()), "--mount", "--uts", "--pid",
                    "--root", "--wd", "--", *argv]
        return self._prefix(argv)

    def _environment(self, env: Mapping[str, str] | None) -> dict[str, str]:
        """A plain root environment, as a login on the host would have (nothing of the
        controller's), with ``env`` added."""
        base = {"PATH": "/srv/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "HOME": "/root", "LANG": "C.UTF-8"}
        return {**base, **(env or {})}

    def install(self, inside: str, data: bytes, mode: int = 0o644) -> None:
        """Write ``data`` at the absolute path ``inside`` of the host's system (folders made),
        into the host's own layer: a stand-in where the real thing lives.

        :raises subprocess.CalledProcessError: the host could not write it.
        """
        _plain_path(inside, "path inside the host")
        self.run(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1" && chmod "$2" "$1"', "sh",
                  inside, format(mode, "o")], input=data)

    def remove(self, inside: str) -> None:
        """Remove the file at ``inside`` from the host's system (an overlay whiteout: the
        cached root keeps it), as on a host that lacks it."""
        _plain_path(inside, "path inside the host")
        self.run(["rm", "-f", "--", inside])

    def describe(self) -> str:
        """``donor (bookworm, 127.0.0.10:PORT)``."""
        return f"{self.name} ({self.release}, {self.address}:{self.port})"

    def __repr__(self) -> str:
        return f"<SystemHost {self.name} {self.release} {self.spec} {'pid ' + str(self.pid) if self.pid else 'stopped'}>"


class SystemLab(Lab):
    """A lab whose hosts each run their own Debian system (see :class:`SystemHost`).

    :param directory: the lab folder, as for :class:`~transplant.lab.hosts.Lab`.
    :param systems: host name -> Debian release (a key of :data:`transplant.lab.roots.RELEASES`),
        in order: the hosts get 127.0.0.10, 127.0.0.11, ...
    :param binds: ``{controller path: path inside}`` bound read-only into every host.
    :param cache: the folder of cached roots; None is ``~/.cache/transplant/lab``. A missing root
        is built first (about 45 s each, from the Debian mirror apt uses).
    :raises TransplantError: as :class:`Lab`, or a root could not be built.
    """

    def __init__(self, directory: Path, systems: Mapping[str, str], *, binds: Mapping[str, str] | None = None,
                 cache: Path | None = None) -> None:
        self._releases = dict(systems)
        self._binds = dict(binds or {})
        self._roots = {release: build_root(release, cache) for release in sorted(set(self._releases.values()))}
        super().__init__(directory, tuple(self._releases))

    def _new_host(self, name: str, address: str, port: int, folder: Path) -> LabHost:
        release = self._releases[name]
        return SystemHost(name, address, port, folder, folder / "lab" / "sshd_config", release=release,
                          system_root=self._roots[release], binds=self._binds)

    def _sshd_config(self, host: LabHost, host_key: Path) -> str:
        inside = host.folder / "lab"
        for path in (host_key, host_key.with_name(host_key.name + ".pub"), self.authorized_keys):
            (inside / path.name).write_bytes(path.read_bytes())
            (inside / path.name).chmod(0o600)
        return sshd_config(host, f"/lab/{host_key.name}", f"/lab/{self.authorized_keys.name}", "/run/sshd.pid")
