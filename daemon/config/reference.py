"""The configuration reference, docs/configuration.md, generated from the declarations
(config/settings.py). Regenerate it after changing a setting:

    .venv/bin/python -m infermux.config.reference > docs/configuration.md
"""

from __future__ import annotations

import sys

from infermux.config.declare import APPLIES, Setting, settings_of, toml_value
from infermux.config.settings import SECTIONS, Section

COMMAND = ".venv/bin/python -m infermux.config.reference > docs/configuration.md"

HEADER = f"""# Configuration reference

Every key of the configuration file (`/etc/infermux/infermux.toml` packaged,
`etc/infermux/infermux.toml` the sample), generated from its one declaration in
`daemon/config/settings.py` by `{COMMAND}`; do not edit it by hand
(`tests/unit/config/test_config_reference.py` checks that it matches). How the file is
read, its errors and its tables: [architecture.md](architecture.md#configuration);
live changes (`infermux ctl set`): [architecture.md](architecture.md#live-changes).

When a change to a key takes effect (the column *applies*):

{chr(10).join(f"- **{name}**: {text}." for name, text in APPLIES.items())}
"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _row(s: Setting) -> str:
    default = "required" if s.required else "none" if s.default is None else f"`{toml_value(s.default)}`"
    default = f"{default} (not set)" if s.unset else default
    applies = f"{s.applies}, `ctl set`" if s.settable else s.applies
    kind = f"{s.kind.name} ({'tables' if s.kind.name.startswith('list') else 'table'} below)" if s.section \
        else s.kind.name
    return "| " + " | ".join(_cell(c) for c in (f"`{s.key}`", kind, default, s.bounds(), applies, s.doc)) + " |"


def section_text(section: Section) -> str:
    """One section's heading, what it is, and a row per key."""
    title = f"[[{section.name}]]" if section.many else f"[{section.name}]"
    rows = [_row(s) for s in settings_of(section.settings).values()]
    return "\n".join([f"## `{title}`", "", section.doc, "",
                      "| key | type | default | allowed | applies | what |", "|---|---|---|---|---|---|", *rows, ""])


def markdown() -> str:
    """The whole reference page."""
    return "\n".join([HEADER, *(section_text(s) for s in SECTIONS)])


if __name__ == "__main__":
    sys.stdout.write(markdown())
