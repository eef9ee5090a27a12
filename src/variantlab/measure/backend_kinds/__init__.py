"""The backends a variant can run on, registered here (the registry: base.py): torch, openai, llamacpp."""
from __future__ import annotations

from .base import BUILD_FIELDS, BackendKind, Opened, accepted, backend_kind, backend_names, register_backend
from .llamacpp_kind import LLAMACPP
from .openai_kind import OPENAI
from .torch_kind import TORCH

register_backend(TORCH)
register_backend(OPENAI)
register_backend(LLAMACPP)

__all__ = ["BUILD_FIELDS", "BackendKind", "Opened", "accepted", "backend_kind", "backend_names",
           "register_backend"]
