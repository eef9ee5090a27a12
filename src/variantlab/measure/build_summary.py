"""What ran per variant, as a run's comparison carries it (`Comparison.builds`): a frozen, typed record.

It is read by attribute (`c.builds["int4"].kernels`) and, as the results JSON's `builds` object it is written
as, by key (`c.builds["int4"]["kernels"]`, `.get("attention")`): the JSON is the same either way, lists
where the record holds tuples. A stored comparison of an earlier version reads back: fields it lacks take
their defaults, fields it has that this version does not know are ignored."""
from __future__ import annotations

from ..payloads import Payload


class BuildSummary(Payload):

    recipe: str | None = None          # the recipe it was built with ("endpoint" for one built nowhere)
    dtype: str | None = None
    attention: str | None = None       # the attention kind it was converted to (None: the model's own)
    kernels: tuple[str, ...] = ()      # what its measurements ran (else what its build said it would)
    notes: tuple[str, ...] = ()
    build_s: float | None = None
    reused: bool = False               # its artifact was reused from an artifacts folder, hashes verified
    not_reused: tuple[str, ...] = ()   # artifacts looked at and why they did not match
    artifact: str | None = None        # where its artifact came from, in words (artifact_line)
    device: str | None = None
    runtime: str | None = None         # what it ran on: torch (our engine), llama.cpp, endpoint
