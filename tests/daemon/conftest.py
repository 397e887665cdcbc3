"""Fixtures of the daemon tests beyond tests/conftest.py's."""

from support.matrix import cell  # noqa: F401  (the feature matrices' per-cell check; each file has its own `placed`)
from support.users import traversable  # noqa: F401  (user nobody may reach the checkout while a module runs)
