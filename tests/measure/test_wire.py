"""What crosses the process boundary (measure/wire.py): frozen, versioned jobs and records, framed
with content-addressed blobs; every way a result can be unreadable is a CorruptResult that says why."""
from __future__ import annotations

import hashlib
import json
import struct

import pytest
from pydantic import ValidationError

from variantlab.measure.wire import (MAGIC, WIRE_VERSION, BuildJob, BuildRecord, CorruptResult, MeasureJob,
                                     MeasurementRecord, TrackerJob, TrackerResult, check_outputs, decode_job,
                                     decode_result, encode_job, encode_result, failed, job_trackers)

BLOB_A = b"\x00\x01log-probs" * 50
BLOB_B = b"targets"
SHA_A = hashlib.sha256(BLOB_A).hexdigest()
SHA_B = hashlib.sha256(BLOB_B).hexdigest()

MEMORY = {"peak_bytes": 3_000, "baseline_bytes": 1_000, "total_bytes": 8_000, "instrument": "test",
          "covered": ["single-stream: 1×12"]}
COLD = {"import_s": 1.0, "tokenizer_s": 0.1, "load_s": 0.2, "first_token_s": 0.05, "total_s": 1.35,
        "clock": "process start"}


def measure_job(**extra) -> MeasureJob:
    fields = dict(variant={"name": "int8", "recipe": "int8"}, artifact_dir="/a/int8", round=2, device="cpu",
                  threads=1, seed=0, samples=({"id": "0", "prompt": "p", "answer": "a"},),
                  trackers=(TrackerJob(kind="cold_start"), TrackerJob(kind="memory")), run_once=True)
    return MeasureJob(**(fields | extra))


def build_job() -> BuildJob:
    return BuildJob(variant={"name": "int8", "recipe": "int8"}, source="/models/tiny", artifact_dir="/a/int8",
                    device="cpu", threads=2, seed=7, calibration_texts=("one", "two"))


def measurement(**extra) -> MeasurementRecord:
    fields = dict(variant="int8", round=2, status="ok", device="cpu", ran_once=True,
                  outputs=(TrackerResult(kind="cold_start", name="cold_start", data=COLD),
                           TrackerResult(kind="memory", name="memory", data=MEMORY)),
                  blobs={SHA_A: len(BLOB_A), SHA_B: len(BLOB_B)}, environment={"torch": "2.13"})
    return MeasurementRecord(**(fields | extra))


BLOBS = {SHA_A: BLOB_A, SHA_B: BLOB_B}


def frame(body: bytes, *blobs: bytes) -> bytes:
    """A result framed by hand: magic, length, the given JSON bytes, then the blobs."""
    return MAGIC + struct.pack("<Q", len(body)) + body + b"".join(blobs)


def corrupt(data: bytes, trackers=None) -> str:
    with pytest.raises(CorruptResult) as info:
        decode_result(data, trackers)
    return str(info.value)


# ---------------------------------------------------------------- round trips

def test_measurement_record_round_trips_with_its_blobs():
    record = measurement()
    data = encode_result(record, BLOBS)
    assert data.startswith(MAGIC)
    back, blobs = decode_result(data, job_trackers(measure_job()))
    assert back == record
    assert blobs == BLOBS
    assert list(blobs) == list(record.blobs)          # in the order the record lists them
    assert back.output("memory").data == MEMORY and back.output("nothing") is None


def test_blobs_travel_in_the_order_the_record_lists_them():
    record = measurement(blobs={SHA_B: len(BLOB_B), SHA_A: len(BLOB_A)})
    data = encode_result(record, BLOBS)
    assert data.endswith(BLOB_B + BLOB_A)
    assert list(decode_result(data)[1]) == [SHA_B, SHA_A]
    assert encode_result(measurement(), BLOBS).endswith(BLOB_A + BLOB_B)


def test_build_record_round_trips():
    record = BuildRecord(variant="int8", status="ok", artifact_dir="/a/int8", reused=True,
                         not_reused=("/x: no artifact there",), facts={"recipe": "int8", "kernels": ["k"]},
                         bytes_on_disk=123, timings={"build_s": 1.5}, environment={"torch": "2.13"})
    back, blobs = decode_result(encode_result(record, {}), {})
    assert isinstance(back, BuildRecord) and back == record and blobs == {}


def test_a_record_without_blobs_round_trips_without_trackers_to_check():
    record = MeasurementRecord(variant="v", round=0, status="failed", reason="boom")
    back, blobs = decode_result(encode_result(record, {}))
    assert back == record and blobs == {}


def test_jobs_round_trip_and_keep_their_kind():
    for job in (build_job(), measure_job()):
        back = decode_job(encode_job(job))
        assert type(back) is type(job) and back == job
    assert decode_job(encode_job(build_job())).calibration_texts == ("one", "two")


def test_failed_records_name_the_variant_and_round():
    r = failed(measure_job(), "failed", "timed out")
    assert isinstance(r, MeasurementRecord)
    assert (r.variant, r.round, r.status, r.reason, r.outputs) == ("int8", 2, "failed", "timed out", ())
    b = failed(build_job(), "unsupported", "no kernel")
    assert isinstance(b, BuildRecord) and (b.variant, b.status, b.reason) == ("int8", "unsupported", "no kernel")


def test_job_trackers_rebuilds_each_tracker_by_name():
    trackers = job_trackers(measure_job())
    assert set(trackers) == {"cold_start", "memory"}
    assert trackers["memory"].kind == "memory"
    assert job_trackers(build_job()) == {}


# ---------------------------------------------------------------- frozen and strict

def test_records_and_jobs_are_frozen():
    record = measurement()
    with pytest.raises(ValidationError):
        record.status = "failed"
    with pytest.raises(ValidationError):
        record.outputs[0].name = "other"
    with pytest.raises(ValidationError):
        BuildRecord(variant="v", status="ok").reason = "x"
    with pytest.raises(ValidationError):
        measure_job().round = 3


@pytest.mark.parametrize("model, fields", [
    (MeasurementRecord, {"variant": "v", "round": 0, "status": "ok"}),
    (BuildRecord, {"variant": "v", "status": "ok"}),
    (TrackerResult, {"kind": "k", "name": "n", "data": {}}),
    (BuildJob, {"variant": {"name": "v"}, "source": "s", "artifact_dir": "a", "device": "cpu", "threads": 1,
                "seed": 0}),
])
def test_unknown_keys_are_rejected(model, fields):
    model.model_validate(fields)  # the fields alone are valid
    with pytest.raises(ValidationError, match="surprise"):
        model.model_validate(fields | {"surprise": 1})


def test_status_must_be_one_of_the_known_ones():
    with pytest.raises(ValidationError):
        MeasurementRecord(variant="v", round=0, status="crashed")


# ---------------------------------------------------------------- corrupt results

def test_bad_magic():
    data = encode_result(measurement(), BLOBS)
    assert "bad magic" in corrupt(b"X" + data[1:])
    assert "bad magic" in corrupt(b"")


def test_truncated_before_the_length():
    assert "before its length" in corrupt(MAGIC + b"\x01\x02\x03")


def test_truncated_record():
    data = encode_result(measurement(), BLOBS)
    body_len = struct.unpack("<Q", data[len(MAGIC):len(MAGIC) + 8])[0]
    cut = data[:len(MAGIC) + 8 + body_len - 5]
    assert f"needs {body_len} bytes, {body_len - 5} are there" in corrupt(cut)


def test_record_that_is_not_json():
    assert "not JSON" in corrupt(frame(b"{not json"))
    assert "not JSON" in corrupt(frame(b"\xff\xfe\x00"))


def test_record_that_is_not_an_object():
    assert "not a JSON object" in corrupt(frame(b"[1, 2]"))


@pytest.mark.parametrize("version", [1, 3, None, "2"])
def test_another_version_says_so(version):
    raw = json.loads(measurement(blobs={}).model_dump_json())
    raw["version"] = version
    if version is None:
        del raw["version"]
    msg = corrupt(frame(json.dumps(raw).encode()))
    assert f"record version {version!r}" in msg
    assert f"reads {WIRE_VERSION}" in msg and "different versions" in msg


@pytest.mark.parametrize("change, field", [
    ({"round": "second"}, "round"),
    ({"status": "crashed"}, "status"),
    ({"surprise": 1}, "surprise"),
    ({"outputs": [{"kind": "memory", "name": "memory"}]}, "outputs.0.data"),
])
def test_schema_violation_names_the_field(change, field):
    raw = json.loads(measurement(blobs={}).model_dump_json()) | change
    msg = corrupt(frame(json.dumps(raw).encode()))
    assert msg.startswith(f"record field {field}:")


def test_schema_violation_of_a_build_record_names_the_field():
    raw = json.loads(BuildRecord(variant="v", status="ok").model_dump_json()) | {"bytes_on_disk": "many"}
    assert corrupt(frame(json.dumps(raw).encode())).startswith("record field bytes_on_disk:")


def test_truncated_blob():
    data = encode_result(measurement(), BLOBS)
    msg = corrupt(data[:-3])                  # the last blob (B) cut short
    assert f"blob {SHA_B[:12]} needs {len(BLOB_B)} bytes, {len(BLOB_B) - 3} are there" in msg
    msg = corrupt(data[:-len(BLOB_B)])        # the last blob missing entirely
    assert f"blob {SHA_B[:12]} needs {len(BLOB_B)} bytes, 0 are there" in msg
    msg = corrupt(data[:-len(BLOB_B) - 1])    # the first blob cut by one byte
    assert f"blob {SHA_A[:12]} needs {len(BLOB_A)} bytes, {len(BLOB_A) - 1} are there" in msg


def test_blob_that_does_not_match_its_hash():
    data = bytearray(encode_result(measurement(), BLOBS))
    data[-1] ^= 0xFF                          # a byte of the last blob (B)
    assert f"blob {SHA_B[:12]} does not match its hash" in corrupt(bytes(data))
    first = bytearray(encode_result(measurement(), BLOBS))
    first[-len(BLOB_B) - 1] ^= 0xFF           # a byte of the first blob (A)
    assert f"blob {SHA_A[:12]} does not match its hash" in corrupt(bytes(first))


def test_output_that_does_not_fit_its_trackers_model():
    bad = dict(MEMORY)
    del bad["peak_bytes"]
    record = measurement(outputs=(TrackerResult(kind="memory", name="memory", data=bad),))
    msg = corrupt(encode_result(record, BLOBS), job_trackers(measure_job()))
    assert msg.startswith("output 'memory' field peak_bytes:")
    extra = measurement(outputs=(TrackerResult(kind="memory", name="memory", data=MEMORY | {"gpu": 1}),))
    assert "output 'memory' field gpu" in corrupt(encode_result(extra, BLOBS), job_trackers(measure_job()))
    # without the job's trackers nothing checks the outputs
    assert decode_result(encode_result(record, BLOBS))[0] == record


def test_output_naming_no_tracker_of_the_job():
    stranger = measurement(outputs=(TrackerResult(kind="scoring", name="scoring", data={}),))
    msg = corrupt(encode_result(stranger, BLOBS), job_trackers(measure_job()))
    assert msg == "output 'scoring' (scoring) is not one of the job's trackers"
    wrong_kind = measurement(outputs=(TrackerResult(kind="cold_start", name="memory", data=MEMORY),))
    assert "output 'memory' (cold_start)" in corrupt(encode_result(wrong_kind, BLOBS), job_trackers(measure_job()))


def test_check_outputs_parses_each_output_with_its_model():
    parsed = check_outputs(measurement(), job_trackers(measure_job()))
    assert parsed["memory"].above_baseline == 2_000
    assert parsed["cold_start"].total_s == 1.35


def test_a_result_that_answers_another_job_is_refused():
    from variantlab.measure.wire import MeasureJob, check_answers
    job = MeasureJob(variant={"name": "a"}, artifact_dir="/x", round=2, device="cpu", threads=1, seed=0, samples=(),
                     trackers=(), run_once=False)
    check_answers(MeasurementRecord(variant="a", round=2, status="ok"), job)
    for wrong in (MeasurementRecord(variant="b", round=2, status="ok"), MeasurementRecord(variant="a", round=1,
                                                                                          status="ok")):
        with pytest.raises(CorruptResult, match="the job was measure 'a' round 2"):
            check_answers(wrong, job)
