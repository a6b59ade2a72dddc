"""The API against its own OpenAPI document: every route documented, and a property-based
fuzz (schemathesis) of every operation that finds no 500 and no response outside the spec.

The fuzz runs on a farm of its own (database 13) with a 300-character text limit: the
generated texts are rendered for real, and must not keep the shared farm's workers busy.
"""

from __future__ import annotations

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.helpers import gunicorn_server, running_farm

pytestmark = pytest.mark.e2e

MAX_CHARS = 300
# Examples per operation and mode: enough to hit every branch of the validation (the models'
# fields, nulls, wrong types, bounds; 50 found the server's own 414 for a long query, which 8
# never sent), few enough that the whole fuzz runs in about a minute.
MAX_EXAMPLES = 50
# What the API promises: no 500, and every response (status, media type, headers, body) as the
# document says. Left out: schemathesis's "valid input must be accepted" and "invalid input
# must be a 400/422" checks. Valid JSON can still be refused on meaning the schema cannot say
# (text with nothing speakable, a book file that is not a book), and a too-long text is a 413.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_headers_conformance, response_schema_conformance]


@pytest.fixture(scope="module")
def fuzz_base(redis_url, tmp_path_factory) -> str:
    log_dir = tmp_path_factory.mktemp("fuzz")
    with running_farm(redis_url, 13, log_dir, max_text_chars=MAX_CHARS) as tf:
        env = dict(tf.env, VOXFARM_MAX_TEXT_CHARS=str(MAX_CHARS))
        with gunicorn_server(env, log_dir / "web.log") as base:
            yield base


@pytest.fixture(scope="module")
def api_schema(fuzz_base):
    return schemathesis.openapi.from_url(f"{fuzz_base}/openapi.json")


def _operations() -> list:
    """(mode, method, path) for every documented operation: valid input for each, invalid
    input where the operation has something to get wrong (a body or a query parameter)."""
    from app.settings import Settings
    from web.openapi import build_spec

    out = []
    for path, item in build_spec(Settings())["paths"].items():
        if path == "/v1/ws":
            continue  # a WebSocket upgrade: tests/e2e/test_streaming.py covers it
        for method, op in item.items():
            if method not in ("get", "post", "delete"):
                continue
            out.append(pytest.param(GenerationMode.POSITIVE, method.upper(), path,
                                    id=f"valid-{method.upper()}-{path}"))
            params = [p for p in op.get("parameters", []) + item.get("parameters", [])
                      if p["in"] == "query" or p["schema"].get("type") == "integer"]
            if "requestBody" in op or params:
                out.append(pytest.param(GenerationMode.NEGATIVE, method.upper(), path,
                                        id=f"invalid-{method.upper()}-{path}"))
    return out


# schemathesis's own pytest loader does not run on pytest 9 (it sets a removed attribute),
# so each operation gets its own Hypothesis test here, built from the operation's strategy.
@pytest.mark.parametrize("mode,method,path", _operations())
def test_api_matches_its_document(api_schema, mode, method, path):
    if path not in api_schema.raw_schema["paths"]:
        pytest.skip(f"{path} is not served by this build")
    operation = api_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck), phases=[Phase.generate])
    def fuzz(case):
        case.call_and_validate(timeout=30, checks=CHECKS)

    fuzz()


def test_every_route_is_documented(client):
    from web.openapi import build_spec, served_paths

    app = client.application
    documented = set(build_spec(app.extensions["voxfarm"].settings)["paths"])
    assert served_paths(app) - documented == set()
    assert documented - served_paths(app) <= {"/metrics"}  # metrics lands separately


def test_document_and_docs_page(server):
    spec = requests.get(f"{server}/openapi.json", timeout=10).json()
    assert spec["openapi"].startswith("3.")
    for path in ("/v1/jobs", "/v1/jobs/{job_id}/stream", "/v1/audio/speech", "/v1/ws",
                 "/v1/voices", "/v1/stats", "/healthz", "/readyz"):
        assert path in spec["paths"], path
    for op in (op for item in spec["paths"].values() for m, op in item.items()
               if m in ("get", "post", "delete")):
        errors = [s for s in op["responses"] if s.startswith(("4", "5")) and s != "503"
                  or s == "503" and op.get("operationId") != "readyz"]
        for status in errors:
            assert op["responses"][status]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/Error"}
    page = requests.get(f"{server}/docs", timeout=10)
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert "/v1/audio/speech" in page.text and "createSpeech" in page.text
    assert "http://" not in page.text and "https://" not in page.text  # nothing fetched


def test_document_takes_its_facts_from_the_code():
    """The document restates nothing: states, formats and the limits that are settings come
    from where they are defined, per app."""
    from app.settings import Settings
    from app.stores.books import BOOK_FORMATS
    from app.stores.states import BookState, JobState
    from web.openapi import build_spec

    spec = build_spec(Settings().with_(max_text_chars=123, max_wait_s=7,
                                       default_voice="en-us"))
    schemas = spec["components"]["schemas"]
    job_request = schemas["JobRequest"]["properties"]
    assert job_request["text"]["maxLength"] == 123 and job_request["voice"]["default"] == "en-us"
    assert schemas["SpeechRequest"]["properties"]["input"]["maxLength"] == 123
    wait = next(p for p in spec["paths"]["/v1/jobs/{job_id}/chunks"]["get"]["parameters"]
                if p["name"] == "wait")
    assert wait["schema"]["maximum"] == 7
    assert schemas["JobState"]["enum"] == [s.value for s in JobState]
    assert schemas["BookState"]["enum"] == [s.value for s in BookState]
    formats = schemas["BookRequest"]["properties"]["formats"]["items"]["enum"]
    assert formats == list(BOOK_FORMATS)
