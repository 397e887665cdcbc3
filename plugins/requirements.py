"""What to install when a plugin's library is missing: the pip extra and the Debian package.

A processor that needs OpenCV on a machine without it is not a mistake in
the configuration file: the file is fine and the extra is missing. So an
ImportError of a library the built-in plugins use becomes MissingDependency,
whose message names the package to install; `serve`, `doctor` and
`ctl reload` say that instead of "configuration error".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Requirement:
    """A library a plugin imports, and how to get it."""

    module: str  # the top-level Python module
    what: str  # its name for people
    extra: str | None  # `pip install 'infermux[extra]'`
    apt: str | None  # the Debian/Ubuntu package, where there is one
    pip: str | None = None  # the PyPI project, when there is no extra for it

    def how(self) -> str:
        """How to install it, as one clause."""
        ways = []
        if self.extra:
            ways.append(f"pip install 'infermux[{self.extra}]'")
        elif self.pip:
            ways.append(f"pip install {self.pip}")
        if self.apt:
            ways.append(f"apt install {self.apt}")
        return " or ".join(f"`{w}`" for w in ways) or f"install the Python module {self.module!r}"


KNOWN = {r.module: r for r in (
    Requirement("cv2", "OpenCV", "processors", "python3-opencv"),
    Requirement("onnxruntime", "ONNX Runtime", "onnx", None),
    Requirement("tensorrt", "TensorRT", None, "python3-libnvinfer"),
    Requirement("cuda", "cuda-python", "tensorrt", None),
    Requirement("textual", "Textual", "tui", "python3-textual"),
)}


class MissingDependency(ImportError):
    """A plugin cannot be used because a library it imports is not installed."""

    def __init__(self, needed_by: str, requirement: Requirement, detail: str) -> None:
        super().__init__(f"{needed_by} needs {requirement.what}, which is not installed here ({detail}): "
                         f"install it with {requirement.how()}, then start again (or reload)",
                         name=requirement.module)
        self.needed_by = needed_by
        self.requirement = requirement


def missing_dependency(exc: ImportError, needed_by: str) -> MissingDependency | None:
    """`exc` as a MissingDependency when the module it failed on is a library we know how to get."""
    if isinstance(exc, MissingDependency):
        return exc
    if not isinstance(exc, ModuleNotFoundError):
        return None  # installed but broken (`cannot import name ...`): its own message says more
    top = (exc.name or "").split(".")[0]
    requirement = KNOWN.get(top)
    return None if requirement is None else MissingDependency(needed_by, requirement, str(exc))
