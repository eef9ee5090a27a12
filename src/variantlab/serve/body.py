"""A request's body: read within its bounds (its size, and the time it takes to come), decoded as JSON and
validated strictly into the protocol's models (serve/protocol.py). Every failure is an ApiError the app
renders OpenAI-shaped: 413 past the size, 408 past the time, 400 for anything else, naming the field when
there is one. JSON that Python's decoder cannot take (nested past the recursion limit, an integer past
`sys.get_int_max_str_digits()` digits, text in no Unicode encoding) is a 400 like any malformed body.
A client that goes away while its body is read raises starlette's ClientDisconnect (the app answers
nobody).
"""
from __future__ import annotations

import asyncio
import json
import sys

from fastapi import Request
from pydantic import ValidationError

from .protocol import ApiError


async def read_body(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    """The body, up to `max_bytes` (413 past it: a chunked body declares no length, so the bound is
    checked as it comes), all there within `timeout_s` (408 else: a client whose Content-Length says
    more than it sends would hold the request for ever)."""
    too_large = ApiError(413, f"the request body is larger than {max_bytes} bytes")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise too_large
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    chunks = request.stream().__aiter__()
    raw = bytearray()
    while True:
        try:
            chunk = await asyncio.wait_for(chunks.__anext__(), max(0.0, deadline - loop.time()))
        except StopAsyncIteration:
            return bytes(raw)
        except asyncio.TimeoutError:
            raise ApiError(408, f"the request body did not arrive within {timeout_s:g} s ({len(raw)} "
                                f"of {declared or 'an unknown number of'} bytes came)", code="body_timeout",
                           headers={"Connection": "close"}) from None
        raw += chunk
        if len(raw) > max_bytes:
            raise too_large


async def parse_body(request: Request, model, max_bytes: int, timeout_s: float):
    """The body read (read_body), decoded as JSON and validated strictly into `model`; ApiError 400 else."""
    raw = await read_body(request, max_bytes, timeout_s)
    try:
        data = json.loads(raw)
    except RecursionError:
        raise ApiError(400, "the body is not valid JSON here: it nests too deeply") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"the body is not valid JSON: {e}") from None
    except ValueError:   # Python reads an integer of at most sys.get_int_max_str_digits() digits
        raise ApiError(400, f"the body is not valid JSON here: it has an integer longer than "
                            f"{sys.get_int_max_str_digits()} digits") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the body must be a JSON object")
    try:
        return model.model_validate(data, strict=True)
    except ValidationError as e:
        # a union's members fail apart (stop: ["a", 1] fails as a string and at item 1 of a list): the deepest says most
        worst = max(e.errors(), key=lambda err: len(err["loc"]))
        param = _param(worst["loc"])
        raise ApiError(400, f"{param}: {worst['msg']}" if param else worst["msg"], param=param) from None


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _param(loc: tuple) -> str | None:
    """The field an error is about, without pydantic's union-member tags: ("stop", "list[str]", 0) → "stop.0"."""
    return ".".join(str(p) for p in loc if isinstance(p, int) or (p.isidentifier() and p not in _TYPE_TAGS)) or None
