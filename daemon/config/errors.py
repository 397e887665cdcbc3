"""The configuration's errors: each names the file, the field path and the reason."""

from __future__ import annotations

from pathlib import Path

from infermux.plugins.requirements import MissingDependency


class ConfigError(Exception):
    """A configuration problem: `file: path: reason`."""

    def __init__(self, file: Path | str, path: str, reason: str) -> None:
        self.file, self.path, self.reason = str(file), path, reason
        super().__init__(f"{file}: {path}: {reason}" if path else f"{file}: {reason}")


class LibraryMissing(ConfigError):
    """The file is valid, but a library one of its steps needs is not installed here: `requirement`
    says what to install (plugins/requirements.py). Not the file's fault, so not reported as such."""

    def __init__(self, file: Path | str, path: str, missing: MissingDependency) -> None:
        super().__init__(file, path, str(missing))
        self.requirement = missing.requirement
