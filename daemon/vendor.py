"""Make the console's vendored dependencies importable.

The Debian package ships Textual and its pure-Python dependencies in
/usr/lib/infermux/vendor, because the distribution's own are far too old
(Debian 12: Textual 0.1.13). The console calls `activate()` before its first
`import textual`:

    from infermux import vendor
    vendor.activate()
    import textual

The directory goes *ahead* of site-packages: Debian's python3-rich or
python3-pygments are often installed and, found first, would be imported in
place of the versions Textual needs. Only the console calls this; the
daemon never imports these packages. Without the directory (pip installs,
a source checkout) nothing changes.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

__all__ = ["VENDOR_DIR", "activate"]

#: Where the Debian package puts the vendored wheels; $INFERMUX_VENDOR_DIR overrides it.
VENDOR_DIR = Path("/usr/lib/infermux/vendor")


def activate(path: str | os.PathLike[str] | None = None) -> bool:
    """Put the vendor directory first on sys.path; True if it exists.

    Call it before the vendored packages are first imported: modules that
    are already in sys.modules stay what they are.
    """
    where = Path(path or os.environ.get("INFERMUX_VENDOR_DIR") or VENDOR_DIR)
    if not where.is_dir():
        return False
    entry = str(where)
    if entry in sys.path:
        sys.path.remove(entry)  # an earlier append would leave it behind site-packages
    sys.path.insert(0, entry)
    return True
