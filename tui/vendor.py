"""Make a vendored Textual importable before the console imports it.

The Debian package ships Textual and its pure-Python dependencies in
/usr/lib/infermux/vendor (Debian 12's own Textual is 0.1.13). The packaging
branch owns the logic in `infermux.vendor`; this module uses it when it is
there and otherwise does the same thing, so the console works on either
side of that merge.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

VENDOR_DIR = Path("/usr/lib/infermux/vendor")


def activate(path: str | os.PathLike[str] | None = None) -> bool:
    """Put the vendor directory ahead of site-packages; True if it exists.

    Call before the first `import textual`: modules already imported stay as they are.
    """
    try:
        from infermux import vendor  # type: ignore[attr-defined]
    except ImportError:
        vendor = None
    if vendor is not None and hasattr(vendor, "activate"):
        return bool(vendor.activate(path))
    where = Path(path or os.environ.get("INFERMUX_VENDOR_DIR") or VENDOR_DIR)
    if not where.is_dir():
        return False
    entry = str(where)
    if entry in sys.path:
        sys.path.remove(entry)  # an earlier append would leave it behind site-packages
    sys.path.insert(0, entry)
    return True
