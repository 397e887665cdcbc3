"""The `[daemon]` table: its keys read as declared (config/settings.py), then the rules between them;
and where its sockets end up (the runtime directory, relative endpoints, the regions socket)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from infermux.config.declare import read_table, resolve
from infermux.config.errors import ConfigError
from infermux.config.settings import DaemonConfig

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib


def parse_daemon(file: Path, table: Any) -> DaemonConfig:
    """The `[daemon]` table, checked."""
    raw = read_table(file, "daemon", table, DaemonConfig)
    _check_admin(file, raw)
    raw.setdefault("engine_dir", DaemonConfig.engine_dir)
    raw.setdefault("max_reply_bytes", raw.get("max_message_bytes", DaemonConfig.max_message_bytes))
    header = raw.get("max_header_bytes", DaemonConfig.max_header_bytes)
    message = raw.get("max_message_bytes", DaemonConfig.max_message_bytes)
    if header > message:
        raise ConfigError(file, "daemon.max_header_bytes", f"{header} is more than max_message_bytes ({message})")
    _check_curve(file, raw)
    if raw.get("state_dir"):
        raw["state_dir"] = str(resolve(file, raw["state_dir"]))
    return DaemonConfig(**raw)


def _check_admin(file: Path, raw: dict[str, Any]) -> None:
    admin = str(raw.get("admin", ""))
    if admin.startswith("tcp://"):
        raise ConfigError(file, "daemon.admin", "the admin socket changes the daemon, so it listens on ipc:// "
                          "only (guarded by file permissions); reach it over SSH")
    if admin.startswith("ipc://@"):
        raise ConfigError(file, "daemon.admin", "an abstract ipc://@ socket has no file permissions, so any "
                          "local user could drain the daemon; use a path (ipc://admin.sock)")


def _check_curve(file: Path, raw: dict[str, Any]) -> None:
    """A tcp:// listener needs both CURVE keys, unless allow_insecure_tcp says otherwise."""
    has_key, has_dir = "curve_secret_key" in raw, "curve_authorized_dir" in raw
    if has_key != has_dir:
        missing = "curve_authorized_dir" if has_key else "curve_secret_key"
        raise ConfigError(file, f"daemon.{missing}", "CURVE needs both curve_secret_key and curve_authorized_dir")
    insecure = raw.get("allow_insecure_tcp", False)
    tcp = [ep for ep in raw.get("listen", ()) if ep.startswith("tcp://")]
    if tcp and not has_key and not insecure:
        raise ConfigError(file, "daemon.listen", f"{tcp[0]} is reachable without file permissions: set "
                          f"curve_secret_key and curve_authorized_dir (see docs/security.md), "
                          f"or allow_insecure_tcp = true")
    stats = raw.get("stats", "")
    if stats.startswith("tcp://") and not insecure:
        raise ConfigError(file, "daemon.stats", f"{stats}: the stats stream has no CURVE; keep it on ipc:// "
                          f"or set allow_insecure_tcp = true")


def runtime_dir(config: DaemonConfig, override: str | None = None) -> Path:
    """Where relative ipc endpoints live.

    The flag wins, then `[daemon] runtime_dir`, then systemd's
    $RUNTIME_DIRECTORY, then /run/infermux when writable, then
    $XDG_RUNTIME_DIR/infermux, then /tmp/infermux-$UID (a developer's box).
    """
    for candidate in (override, config.runtime_dir, os.environ.get("RUNTIME_DIRECTORY", "").split(":")[0]):
        if candidate:
            return Path(candidate)
    system = Path("/run/infermux")
    if os.access(system if system.exists() else system.parent, os.W_OK):
        return system
    if os.environ.get("XDG_RUNTIME_DIR"):
        return Path(os.environ["XDG_RUNTIME_DIR"]) / "infermux"
    return Path(f"/tmp/infermux-{os.getuid()}")


def regions_path(daemon: DaemonConfig, run_dir: Path) -> Path | None:
    """Where the shared-memory registration socket goes; None when it is off.

    A relative `shared_memory` lies beside the first ipc:// listener, where
    clients look for it (client.shared_memory.regions_path), whether that
    listener is relative or absolute; without one (tcp only) it goes in the
    runtime directory. An absolute name is used as written.
    """
    name = daemon.shared_memory
    if not name:
        return None
    if os.path.isabs(name):
        return Path(name)
    for endpoint in daemon.listen:
        resolved = resolve_endpoint(endpoint, run_dir)
        if resolved.startswith("ipc://") and not resolved.startswith("ipc://@"):
            return Path(resolved[len("ipc://"):]).parent / name
    return run_dir / name


def resolve_endpoint(endpoint: str, run_dir: Path) -> str:
    """`ipc://name.sock` (relative) -> `ipc://<run_dir>/name.sock`; others unchanged."""
    if endpoint.startswith("ipc://") and not endpoint[len("ipc://"):].startswith(("/", "@")):
        return f"ipc://{run_dir / endpoint[len('ipc://'):]}"
    return endpoint


# What a client command needs from the [daemon] table: where the sockets are.
SOCKET_FIELDS = ("listen", "admin", "stats", "runtime_dir", "shared_memory")


def load_sockets(path: str | os.PathLike[str]) -> DaemonConfig:
    """Only the socket settings of a configuration file, for `status`, `ctl`, `infer`, `bench` and `tune`.

    Nothing else is validated: an operator who has just broken a model's
    settings must still reach the daemon to see `status` and to `ctl reload`
    (which the daemon then refuses with the reason). A socket field of the
    wrong type keeps its default. Raises ConfigError when the file cannot be
    read or is not TOML.
    """
    file = Path(path).expanduser().resolve()
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(file, "", f"cannot read: {exc.strerror}") from None
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(file, "", f"not valid TOML: {exc}") from None
    table = data.get("daemon")
    table = table if isinstance(table, dict) else {}
    raw: dict[str, Any] = {k: table[k] for k in SOCKET_FIELDS if isinstance(table.get(k), str)}
    listen = table.get("listen")
    if isinstance(listen, list) and listen and all(isinstance(ep, str) for ep in listen):
        raw["listen"] = tuple(listen)
    elif isinstance(listen, str):
        raw["listen"] = (listen,)
    return DaemonConfig(**raw)
