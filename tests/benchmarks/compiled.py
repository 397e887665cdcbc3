"""The compiled reference servers, built here with the system's C compiler against pyzmq's own libzmq.

echo.c is a program; bare.c is an extension module (`_cbare`) that
baselines.py's `compiled-bare` server imports, since it calls onnxruntime
through its Python binding as the bare loop does. Both link the libzmq
that pyzmq loads, so every server in a comparison uses the same ZeroMQ.
Where there is no compiler the build says why and the benchmark leaves
the server out.
"""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Built:
    """What a build made (a program, or the folder holding a module), or why it made nothing."""

    path: Path | None
    missing: str = ""


def loaded_libzmq() -> Path | None:
    """The libzmq shared library this interpreter's pyzmq has loaded (bundled in its wheel, or the system's)."""
    import zmq  # noqa: F401  (loads the library)

    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if "libzmq" in Path(path).name and ".so" in path:
            return Path(path)
    return None


def _compile(source: Path, output: Path, extra: list[str]) -> str:
    """cc on `source` linked to pyzmq's libzmq; an empty string, or why it failed."""
    cc, libzmq = shutil.which("cc"), loaded_libzmq()
    if cc is None:
        return "no C compiler (cc) on this machine"
    if libzmq is None:
        return "pyzmq's libzmq was not found in this process's mappings"
    r = subprocess.run([cc, "-O2", f"-I{HERE}", *extra, "-o", str(output), str(source), str(libzmq),
                        f"-Wl,-rpath,{libzmq.parent}"], capture_output=True, text=True, timeout=120)
    return "" if r.returncode == 0 else f"cc failed: {(r.stdout + r.stderr).strip()[-300:]}"


def build_echo(out_dir: Path) -> Built:
    """echo.c as the program `out_dir/echo`, run as `echo ENDPOINT`."""
    missing = _compile(HERE / "echo.c", out_dir / "echo", [])
    return Built(None if missing else out_dir / "echo", missing)


def build_bare(out_dir: Path) -> Built:
    """bare.c as the module `_cbare` in `out_dir` (the folder is what `compiled-bare` is given)."""
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        return Built(None, f"no Python.h in {include} (the Python development headers)")
    module = out_dir / f"_cbare{sysconfig.get_config_var('EXT_SUFFIX')}"
    missing = _compile(HERE / "bare.c", module, ["-shared", "-fPIC", f"-I{include}"])
    return Built(None if missing else out_dir, missing)
