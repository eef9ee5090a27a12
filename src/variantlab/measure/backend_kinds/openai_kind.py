"""backend: openai — an OpenAI-compatible endpoint (our `variantlab serve`, vLLM, llama.cpp's server, a hosted
API) measured as it serves: nothing is built, and the trackers that drive a backend (the scenarios, grading,
the machine's yardstick) run against it over HTTP; those that need the model in this process say why they are
not measured (backends/openai_http.py)."""
from __future__ import annotations

from ..process import setup
from .base import BackendKind, Opened

FIELDS = ("base_url", "served_model", "api_key_env")


def check_openai(spec) -> None:
    if spec.base_url is None:
        raise ValueError("backend: openai needs base_url (an OpenAI-compatible endpoint, e.g. "
                         "http://127.0.0.1:8000/v1)")


def endpoint_config(spec) -> dict:
    return {"base_url": spec.base_url, "model": spec.served_model, "api_key_env": spec.api_key_env}


def describe_endpoint(config: dict) -> dict:
    return {"recipe": "endpoint", "dtype": None, "kernels": [f"served by {config['base_url']}"],
            "notes": [f"backend: openai, model {config.get('model') or 'auto'}: only what the endpoint exposes is "
                      "measured"], "extra": {"runtime": "endpoint"}}


def open_endpoint(job, t_start: float) -> Opened:
    from ...backends.openai_http import Endpoint, OpenAIBackend
    from ...environment import torch_fingerprint
    endpoint = Endpoint.from_json(job.variant.backend_config)
    setup("cpu", job.threads, job.seed)
    backend = OpenAIBackend(endpoint)
    served = (f"served by {endpoint.base_url} (model {endpoint.model})",)
    return Opened(backend, device="endpoint", environment=torch_fingerprint("cpu", job.seed),
                  kernels=lambda: served, close=backend.close)


OPENAI = BackendKind("openai", "an OpenAI-compatible endpoint at base_url, measured as it serves", open_endpoint,
                     fields=FIELDS, refusal="an endpoint is measured as it serves", check=check_openai,
                     config=endpoint_config, builds=False, local_model=False, label="endpoint",
                     describe=describe_endpoint, runtime="endpoint")
