"""Immutable records of what a scenario observed: one per request.

Times are seconds on one monotonic clock (time.perf_counter in the measuring process), so they
are comparable within one measurement and never across processes. Metrics are pure functions over
these records (measure/metrics.py).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class RequestRecord:
    """One request as a scenario saw it.

    token_times holds the time each output token became available on the host (the device was
    synchronised first), so token_times[0] is the first-token time. From an HTTP endpoint it holds the
    arrival time of each streamed chunk that carried text, and usage_tokens the server's token count.
    """

    request_id: str
    send_time: float
    end_time: float
    token_times: tuple[float, ...] = ()
    tokens_in: int = 0
    output_text: str = ""
    error: str | None = None
    token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None    # "stop" (EOS or a stop string) | "length" | None (errored)
    usage_tokens: int | None = None     # output tokens as the server counted them (an HTTP endpoint's usage),
                                        # where one streamed chunk may carry several tokens

    @property
    def tokens_out(self) -> int:
        return self.usage_tokens if self.usage_tokens is not None else len(self.token_times)

    @property
    def first_token_time(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict:
        return asdict(self) | {"token_times": list(self.token_times), "token_ids": list(self.token_ids)}

    @classmethod
    def from_json(cls, d: dict) -> "RequestRecord":
        return cls(**(d | {"token_times": tuple(d.get("token_times", ())),
                           "token_ids": tuple(d.get("token_ids", ()))}))


@dataclass(frozen=True)
class ScenarioPass:
    """One timed pass of a scenario: the records, and the wall clock around all of them."""

    scenario: str
    start_time: float
    end_time: float
    records: tuple[RequestRecord, ...] = field(default_factory=tuple)
    paused: float = 0.0     # of the wall clock, while other variants took their turns, and the lead-ins after

    @property
    def wall_time(self) -> float:
        return self.end_time - self.start_time - self.paused

    def to_json(self) -> dict:
        return {"scenario": self.scenario, "start_time": self.start_time, "end_time": self.end_time,
                "records": [r.to_json() for r in self.records]} | ({"paused": self.paused} if self.paused else {})

    @classmethod
    def from_json(cls, d: dict) -> "ScenarioPass":
        return cls(d["scenario"], d["start_time"], d["end_time"],
                   tuple(RequestRecord.from_json(r) for r in d["records"]), d.get("paused", 0.0))
