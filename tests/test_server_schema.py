"""`gemma-cy serve` fuzzed from its own OpenAPI document (docs/server.md#the-openapi-document)
by schemathesis: for requests made from every operation's schema, valid and
not, no response is a server error, and every response matches the status
and the schema the document gives it (the error object included). A bounded
run here (``GEMMA_CY_SCHEMA_EXAMPLES`` cases per operation and mode, 60 unless
set, the same ones every run); `make fuzz` runs a long, random one."""
from __future__ import annotations

import os

import pytest

schemathesis = pytest.importorskip("schemathesis", reason="the schema fuzz needs schemathesis (make test installs it)")
pytest.importorskip("fastapi", reason="gemma-cy serve needs its extra: pip install 'gemma-cy[server]'")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from schemathesis.checks import not_a_server_error  # noqa: E402
from schemathesis.generation import GenerationMode  # noqa: E402
from schemathesis.specs.openapi.checks import (content_type_conformance, ignored_auth,  # noqa: E402
                                               negative_data_rejection, response_schema_conformance,
                                               status_code_conformance)

from server_helpers import ServerProcess  # noqa: E402

KEY = "sk-schema-key"
EXAMPLES = int(os.environ.get("GEMMA_CY_SCHEMA_EXAMPLES", "60"))
RANDOM = os.environ.get("GEMMA_CY_SCHEMA_RANDOM") == "1"  # make fuzz: new cases each run (else the same ones)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          ignored_auth]


@pytest.fixture(scope="module")
def server(tiny_model_path):
    proc = ServerProcess("-m", str(tiny_model_path), "--ctx", "256", "--max_sequences", "4", "--max_queue", "64",
                         "--api_key", KEY, "--max_body", "65536")
    yield proc
    code, log = proc.stop()
    assert code == 0, log


@pytest.fixture(scope="module")
def api_schema(server):
    return schemathesis.openapi.from_url(server.url + "/openapi.json", headers={"Authorization": f"Bearer {KEY}"})

OPERATIONS = [("GET", "/"), ("GET", "/health"), ("GET", "/metrics"), ("GET", "/v1/models"),
              ("GET", "/v1/models/{model_id}"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
              ("POST", "/tokenize"), ("POST", "/detokenize")]


def test_the_document_names_every_route_and_its_bodies(server):
    import httpx
    assert httpx.get(server.url + "/openapi.json").status_code == 401  # behind the key, like the API
    doc = httpx.get(server.url + "/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).json()
    assert {(method.upper(), path) for path, ops in doc["paths"].items() for method in ops} == set(OPERATIONS)
    body = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/ChatCompletionRequest"}
    temperature = doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]["temperature"]
    assert (temperature["minimum"], temperature["maximum"]) == (0, 2)
    assert doc["paths"]["/v1/completions"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in doc["paths"]["/health"]["get"]


TAKING_INPUT = [op for op in OPERATIONS if op[0] == "POST" or "{" in op[1]]  # what a negative case can break


@pytest.mark.parametrize("method, path, mode",
                         [(m, p, GenerationMode.POSITIVE) for m, p in OPERATIONS]
                         + [(m, p, GenerationMode.NEGATIVE) for m, p in TAKING_INPUT],
                         ids=lambda x: x.value if isinstance(x, GenerationMode) else str(x))
def test_every_response_matches_the_document(api_schema, method, path, mode):
    """Positive cases (valid by the document) and negative ones (each
    breaking it somewhere: those must be refused with a 4xx). Schemathesis'
    own pytest plugin (``from_fixture``) fails on pytest 9, so the
    operations are taken from the loaded document here."""
    checks = CHECKS + [negative_data_rejection] if mode is GenerationMode.NEGATIVE else CHECKS

    @given(case=api_schema[path][method].as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=not RANDOM, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))
    def check(case):
        case.call_and_validate(headers={"Authorization": f"Bearer {KEY}"}, checks=checks, timeout=60)
    check()
