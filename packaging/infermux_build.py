"""The build backend: setuptools' own, plus the frontend's compiled socket calls.

pyproject.toml names this module as its build backend (backend-path
"packaging"), since declaring a C extension in pyproject.toml needs
setuptools 74, newer than Debian 12's (66) or Ubuntu 22.04's, and the
top-level layout has no place for a setup.py. Everything else is
setuptools.build_meta unchanged.

The extension, infermux.transport._wire (daemon/transport/_wire.c), is
optional: where no C compiler or Python headers are found the build warns
and goes on, and the daemon uses pyzmq's calls instead (wire.py says which
it runs, in `infermux status` and `infermux doctor`).
"""

from __future__ import annotations

from setuptools import Extension, setup
from setuptools import build_meta as _setuptools
from setuptools.command.sdist import sdist

WIRE = Extension("infermux.transport._wire", ["daemon/transport/_wire.c"], optional=True,
                 extra_compile_args=["-O2"], libraries=["dl"])
BACKEND = "packaging/infermux_build.py"


class _Sdist(sdist):
    """An sdist that carries this backend: without it the sdist cannot be built (the container image
    builds infermux from one). setuptools adds no backend-path module itself, and the top-level
    layout has no place for a MANIFEST.in; the file is added to the tree the archive is made from."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files if BACKEND in files else [*files, BACKEND])


class _Backend(_setuptools._BuildMetaBackend):
    def run_setup(self, setup_script: str = "setup.py") -> None:
        setup(ext_modules=[WIRE], cmdclass={"sdist": _Sdist})


_backend = _Backend()
get_requires_for_build_wheel = _backend.get_requires_for_build_wheel
get_requires_for_build_sdist = _backend.get_requires_for_build_sdist
prepare_metadata_for_build_wheel = _backend.prepare_metadata_for_build_wheel
build_wheel = _backend.build_wheel
build_sdist = _backend.build_sdist
get_requires_for_build_editable = _backend.get_requires_for_build_editable
prepare_metadata_for_build_editable = _backend.prepare_metadata_for_build_editable
build_editable = _backend.build_editable
