"""Typed errors that say what to do.

Library code raises these; only the CLI prints them (one line, exit status 2, no traceback).
Each error names where the bad input lives (a file and a field path) and what would be accepted.
"""
from __future__ import annotations


class VariantlabError(Exception):
    """Base of every error a user can fix by changing their input."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None,
                 accepted: str | None = None) -> None:
        self.file = file
        self.field = field
        self.accepted = accepted
        self.detail = message
        super().__init__(self.one_line())

    def one_line(self) -> str:
        where = ": ".join(p for p in (self.file, self.field) if p)
        text = f"{where}: {self.detail}" if where else self.detail
        if self.accepted:
            text += f" (accepted: {self.accepted})"
        return " ".join(text.split())


class SuiteError(VariantlabError):
    """The suite file is malformed, has unknown keys or wrong types."""


class ModelLoadError(VariantlabError):
    """A model directory is missing, is not a causal LM, or its weights are corrupt."""


class DatasetError(VariantlabError):
    """A dataset file is missing or a record lacks a required field."""


class RecipeError(VariantlabError):
    """A recipe is unknown or cannot be applied to this model or device."""


class UnsupportedOnHardware(RecipeError):
    """The recipe is valid but this device has no kernel for it."""


class StoreError(VariantlabError):
    """The results store cannot be opened or a run id is unknown."""
