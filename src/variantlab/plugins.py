"""Plugins: the modules named in VARIANTLAB_PLUGINS (comma-separated, importable from sys.path) are imported
once, when variantlab is, in every process it runs: the command's and each measuring worker's (a worker
inherits the environment). A plugin registers its kinds with the registries (a backend, an attention kind, a
scenario, a serve policy: docs/architecture.md), so adding one needs no edit to variantlab itself. A plugin
that fails to import is kept as one line (`error()`), which the command reports as bad input."""
from __future__ import annotations

import importlib
import os

ENV = "VARIANTLAB_PLUGINS"
_loaded: list[str] = []
_error: list[str] = []


def load() -> None:
    """Import each plugin module named in VARIANTLAB_PLUGINS not imported yet; the first failure is kept."""
    for name in (n.strip() for n in os.environ.get(ENV, "").split(",")):
        if not name or name in _loaded:
            continue
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any failure of a user's module is reported, never a traceback
            if not _error:
                _error.append(f"plugin {name!r} did not import: {type(e).__name__}: {e}")
            continue
        _loaded.append(name)


def error() -> str | None:
    return _error[0] if _error else None
