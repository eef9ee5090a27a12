"""What crosses a process boundary: jobs in, records out — frozen, versioned, validated when read.

A job (`BuildJob`, `MeasureJob`) is everything a worker needs, as data: the variant, the samples
(not a path to them), the trackers to host. A record (`BuildRecord`, `MeasurementRecord`) is
everything it found, as data; large arrays (teacher-forced log-probs) travel beside it as
content-addressed blobs (sha256 → bytes), which the runner puts in the results store. Nothing a
worker returns is a path the parent must read, so a worker may run on another host (Ray).

On the wire (local executor) a result is one byte string: MAGIC, the record's JSON length (8 bytes,
little-endian), the JSON, then each blob's bytes in the order the record lists them. `decode_result`
checks the magic, the version, the record's schema, every tracker output against its tracker's
model and every blob against its hash; anything wrong raises `CorruptResult`, which the executor
turns into a failed measurement with the reason.
"""
from __future__ import annotations

import hashlib
import json
import struct
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..environment import WorkerEnvironment
from ..variants.build import VariantDefinition
from ..variants.facts import VariantFacts

WIRE_VERSION = 2
MAGIC = b"VARIANTLAB-RESULT\n"
Status = Literal["ok", "failed", "unsupported"]


class CorruptResult(Exception):
    """A worker's result that cannot be read: truncated, of another version, or failing validation."""


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")


class TrackerJob(_Wire):
    kind: str
    config: dict[str, Any] = Field(default_factory=dict)


class BuildJob(_Wire):
    version: Literal[WIRE_VERSION] = WIRE_VERSION
    kind: Literal["build"] = "build"
    variant: VariantDefinition
    source: str                             # the checkpoint directory
    artifact_dir: str
    device: str
    threads: int
    seed: int
    calibration_texts: tuple[str, ...] = ()
    trust_remote_code: bool = False         # the suite's switch: may the checkpoint's own Python run


class MeasureJob(_Wire):
    version: Literal[WIRE_VERSION] = WIRE_VERSION
    kind: Literal["measure"] = "measure"
    variant: VariantDefinition
    artifact_dir: str
    round: int
    device: str
    threads: int
    seed: int
    samples: tuple[dict[str, Any], ...]
    trackers: tuple[TrackerJob, ...]
    run_once: bool                          # host the once-per-variant trackers (its first good round)
    trust_remote_code: bool = False
    reference_dir: str | None = None        # the run's baseline reference (measure/reference.py): read, or
    writes_reference: bool = False          # written by this job (the baseline's reference job: scoring alone)
    same_checkpoint: bool = False           # the variant comes from the baseline's checkpoint: its tokenizer's
                                            # ids are the baseline's, so it is scored on the reference's ids
    turns: bool = False                     # its round runs in turns: wait at each turn for the executor's go
                                            # on stdin (measure/turns.py)


Job = Union[BuildJob, MeasureJob]


class TrackerResult(_Wire):
    kind: str
    name: str
    data: dict[str, Any]
    error: str | None = None        # a once-per-variant tracker that raised: why (data is then empty)


class BuildRecord(_Wire):
    version: Literal[WIRE_VERSION] = WIRE_VERSION
    kind: Literal["build"] = "build"
    variant: str
    status: Status
    reason: str | None = None
    artifact_dir: str | None = None
    reused: bool = False
    not_reused: tuple[str, ...] = ()        # artifacts looked at and why they did not match
    facts: VariantFacts | None = None
    bytes_on_disk: int | None = None
    timings: dict[str, float] = Field(default_factory=dict)   # load_s, apply_s, save_s, build_s
    environment: WorkerEnvironment = Field(default_factory=WorkerEnvironment)


class MeasurementRecord(_Wire):
    version: Literal[WIRE_VERSION] = WIRE_VERSION
    kind: Literal["measure"] = "measure"
    variant: str
    round: int
    status: Status
    reason: str | None = None
    device: str | None = None
    ran_once: bool = False
    kernels: tuple[str, ...] = ()          # what the loaded variant ran (its build's, plus runtime settings: compile)
    notes: tuple[str, ...] = ()
    outputs: tuple[TrackerResult, ...] = ()
    blobs: dict[str, int] = Field(default_factory=dict)     # sha256 → bytes, in wire order
    environment: WorkerEnvironment = Field(default_factory=WorkerEnvironment)

    def output(self, name: str) -> TrackerResult | None:
        return next((o for o in self.outputs if o.name == name), None)


Record = Union[BuildRecord, MeasurementRecord]


def failed(job: Job, status: Status, reason: str) -> Record:
    """The record of a job that produced none of its own (crash, timeout, corrupt result)."""
    name = job.variant.name
    if isinstance(job, BuildJob):
        return BuildRecord(variant=name, status=status, reason=reason)
    return MeasurementRecord(variant=name, round=job.round, status=status, reason=reason)


def encode_result(record: Record, blobs: dict[str, bytes]) -> bytes:
    body = record.model_dump_json().encode()
    parts = [MAGIC, struct.pack("<Q", len(body)), body]
    for sha in getattr(record, "blobs", {}):
        parts.append(blobs[sha])
    return b"".join(parts)


def decode_result(data: bytes, trackers: dict[str, Any] | None = None) -> tuple[Record, dict[str, bytes]]:
    """(record, blobs) from `encode_result`'s bytes; CorruptResult when anything does not hold.

    `trackers`: name → tracker of the job, whose output models validate each output's data."""
    if not data.startswith(MAGIC):
        raise CorruptResult("not a variantlab worker result (bad magic)")
    at = len(MAGIC)
    if len(data) < at + 8:
        raise CorruptResult("truncated before its length")
    (n,) = struct.unpack("<Q", data[at:at + 8])
    at += 8
    if len(data) < at + n:
        raise CorruptResult(f"truncated: the record needs {n} bytes, {len(data) - at} are there")
    try:
        raw = json.loads(data[at:at + n])
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptResult(f"record is not JSON ({type(e).__name__})") from None
    if not isinstance(raw, dict):
        raise CorruptResult("record is not a JSON object")
    if raw.get("version") != WIRE_VERSION:
        raise CorruptResult(f"record version {raw.get('version')!r}; this variantlab reads {WIRE_VERSION} "
                            "(worker and parent are different versions)")
    model = BuildRecord if raw.get("kind") == "build" else MeasurementRecord
    try:
        record = model.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        raise CorruptResult(f"record field {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    at += n
    blobs: dict[str, bytes] = {}
    for sha, size in getattr(record, "blobs", {}).items():
        chunk = data[at:at + size]
        if len(chunk) != size:
            raise CorruptResult(f"truncated: blob {sha[:12]} needs {size} bytes, {len(chunk)} are there")
        if hashlib.sha256(chunk).hexdigest() != sha:
            raise CorruptResult(f"blob {sha[:12]} does not match its hash")
        blobs[sha] = chunk
        at += size
    if at != len(data):
        raise CorruptResult(f"{len(data) - at} bytes after the last blob")
    if trackers is not None and isinstance(record, MeasurementRecord):
        check_outputs(record, trackers)
    return record, blobs


def check_answers(record: Record, job: Job) -> None:
    """CorruptResult unless `record` is the answer to `job` (its kind, variant and round)."""
    want = ("build" if isinstance(job, BuildJob) else "measure", job.variant.name, getattr(job, "round", 0))
    got = (record.kind, record.variant, getattr(record, "round", 0))
    if got != want:
        raise CorruptResult(f"the result is for {got[0]} {got[1]!r} round {got[2]}, the job was {want[0]} "
                            f"{want[1]!r} round {want[2]}")


def check_outputs(record: MeasurementRecord, trackers: dict[str, Any]) -> dict[str, BaseModel]:
    """Each output parsed by its tracker's model (name → output); CorruptResult when one does not fit."""
    parsed = {}
    for out in record.outputs:
        tracker = trackers.get(out.name)
        if tracker is None or tracker.kind != out.kind:
            raise CorruptResult(f"output '{out.name}' ({out.kind}) is not one of the job's trackers")
        if out.error is not None:
            continue
        try:
            parsed[out.name] = tracker.output_model.model_validate(out.data)
        except ValidationError as e:
            err = e.errors()[0]
            raise CorruptResult(f"output '{out.name}' field {'.'.join(map(str, err['loc']))}: {err['msg']}") from None
    return parsed


def encode_job(job: Job) -> bytes:
    return job.model_dump_json().encode()


def decode_job(data: bytes) -> Job:
    raw = json.loads(data)
    return (BuildJob if raw.get("kind") == "build" else MeasureJob).model_validate(raw)


def job_trackers(job: Job) -> dict[str, Any]:
    """name → tracker of a measure job (rebuilt from the registry), to validate its record's outputs."""
    if not isinstance(job, MeasureJob):
        return {}
    from .trackers import tracker_from_config
    trackers = (tracker_from_config(t.kind, t.config) for t in job.trackers)
    return {t.name: t for t in trackers}
