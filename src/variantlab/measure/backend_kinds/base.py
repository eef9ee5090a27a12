"""The backend registry: each runtime a variant can run on is a `BackendKind` that says what it takes from the
suite, whether it builds anything, whether its model runs in the measuring process, and how the measuring
worker brings it up.

The suite (`backend:` and the fields each backend owns), planning, the runner's builds and the worker's
measurement all read a kind from here, so none of them matches a backend by name. Adding a backend is one
module that defines its hooks and one `register_backend(BackendKind(...))` (measure/backend_kinds/__init__.py
registers the built-in ones; a plugin module named in VARIANTLAB_PLUGINS, variantlab/plugins.py, may register
its own), and its tests. docs/architecture.md walks through one.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager

from ...errors import VariantlabError
from ...variants.build import VariantDefinition

# the suite fields that make a variant from a checkpoint: a backend takes those it names in `takes`
BUILD_FIELDS = ("recipe", "options", "model", "weight_dtype", "activation_dtype", "quant_scheme", "attention",
                "attention_options", "compile")


@dataclass
class Opened:
    """A variant brought up in the measuring worker: what its trackers run on (measure/worker.py's Host), and
    what its measurement record says of it."""

    backend: Any                        # a Backend (backends/base.py)
    built: Any = None                   # the BuiltVariant where the model is in this process, else None
    device: str = "cpu"                 # the record's device ("endpoint" for a server measured from outside)
    cold: Any = None                    # its ColdStartOutput where this process loaded it, else None
    baseline_bytes: int = 0             # memory in use before loading (the memory tracker's zero)
    environment: dict = field(default_factory=dict)
    kernels: Callable[[], tuple[str, ...]] = tuple      # read when the record is written (compiling adds some)
    notes: Callable[[], tuple[str, ...]] = tuple
    context: Callable[[], ContextManager] = contextlib.nullcontext   # held while the trackers run
    close: Callable[[], None] = lambda: None


@dataclass(frozen=True)
class BackendKind:
    name: str
    help: str
    open: Callable[[Any, float], Opened]          # (MeasureJob, the process's start time) → Opened, in the worker
    takes: tuple[str, ...] = ()                   # which BUILD_FIELDS it accepts; the others are refused
    fields: tuple[str, ...] = ()                  # suite fields only this backend takes (base_url, …)
    refusal: str = "it is not built from a checkpoint"   # why the BUILD_FIELDS it does not take cannot apply
    check: Callable[[Any], None] = lambda spec: None     # the suite entry's own check: ValueError says what is wrong
    config: Callable[[Any], dict] = lambda spec: {}      # what its jobs carry of the suite entry
    builds: bool = True                           # built from the checkpoint into an artifact (a build job)
    build: Callable[[Any], Any] | None = None     # BuildJob → (BuildRecord, blobs), in the worker (builds only)
    local_model: bool = True                      # its model runs in the measuring process (else the trackers
                                                  # that need it say why they are not measured)
    our_kernels: bool = False                     # runs variantlab's CPU kernels: built once, before any worker
    serves: bool = False                          # `variantlab serve` can host it (our engine's batched lanes)
    label: str = ""                               # how a variant that builds nothing is shown ("endpoint")
    describe: Callable[[dict], dict] = lambda config: {}  # a variant that builds nothing: its build facts
    # (suite entry, the suite's folder, the suite file, the entry's field) → its VariantDefinition, or a
    # VariantlabError naming what is wrong. None: a building backend's variant is planned from the checkpoint
    # by its recipe (measure/plan.py), one that builds nothing as its name and `config`.
    plan: Callable[[Any, Path, str, str], Any] | None = None
    # (artifact folder, VariantDefinition, checkpoint, Plan) → why that artifact is not this variant's, or None
    # (reuse and resume check it). None: a torch artifact's check (variants/artifact.artifact_problem).
    artifact_problem: Callable[[Path, Any, Path, Any], str | None] | None = None
    torch_model: bool = True                      # its model is our torch modules: trackers that read them run
    runtime: str = "torch"                        # what the table says the variant runs on
    # (VariantDefinition, its checkpoint) → its artifact's ArtifactSize (variants/artifact_size.py), estimated from
    # the checkpoint's safetensors headers without building: the disk budget reads it (measure/disk_budget.py).
    # None: a backend whose artifacts are not estimated (the budget names the variant).
    artifact_size: Callable[[Any, Path], Any] | None = None

    def plan_variant(self, spec, base_dir: Path, file: str, field: str):
        """The variant's definition where this backend plans it (its `plan` hook, or a backend that builds
        nothing); None where measure/plan.py plans it from the checkpoint."""
        if self.plan is not None:
            return self.plan(spec, base_dir, file, field)
        if not self.builds:
            return VariantDefinition(spec.name, backend=self.name, backend_config=self.config(spec))
        return None


_KINDS: dict[str, BackendKind] = {}


def register_backend(kind: BackendKind) -> BackendKind:
    if kind.name in _KINDS:
        raise ValueError(f"a backend named {kind.name!r} is registered already")
    if kind.builds and kind.build is None:
        raise ValueError(f"backend {kind.name!r} builds (builds=True) but has no build hook")
    _KINDS[kind.name] = kind
    return kind


def backend_names() -> tuple[str, ...]:
    return tuple(_KINDS)


def accepted() -> str:
    return " | ".join(_KINDS)


def backend_kind(name: str, field: str = "backend") -> BackendKind:
    """The registered kind; bad input naming `field` for any other name."""
    try:
        return _KINDS[name]
    except KeyError:
        raise VariantlabError(f"unknown backend {name!r}", field=field, accepted=accepted()) from None
