"""schemathesis over the server's own /openapi.json (issue 38): with every
check on, no generated request gets a server error, an undocumented status
or content type, a body that breaks its schema, or a 405 without `Allow`,
and a body the schema allows is answered (positive_data_acceptance): the
schema says the served model's bounds (openapi_limits). The one 400 it
cannot foresee is a rendered prompt longer than the context (a count of
tokens, not of characters), and only that is let through. Bounded: a fixed
seed and a few examples per operation (about a minute)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
httpx = pytest.importorskip("httpx2", reason="httpx2 comes with openai")
ST = shutil.which("st", path=str(Path(sys.executable).parent))


@pytest.fixture(scope="module")
def server(vllm_compat_server):
    return vllm_compat_server


@pytest.mark.skipif(ST is None, reason="schemathesis is a dev requirement (requirements/dev.txt)")
def test_schemathesis_finds_nothing(server, tmp_path):
    r = subprocess.run(
        [ST, "run", server.url + "/openapi.json", "--checks", "all", "--max-examples", "10",
         "--seed", "38", "--request-timeout", "30", "--workers", "2", "--no-color"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = r.stdout
    # schemathesis 4.32 sometimes crashes generating a pooling route's recursive input
    # schema ("Runtime Error ... Inconsistent results": the tool's, not a response's);
    # any failure of a check, or any other error (a timeout, a dropped connection), fails
    errors = re.findall(r"^  \S+ (.+): \d+$", out.split("Errors:")[1].split("\n\n")[0],
                        re.M) if "Errors:" in out else []
    assert set(errors) <= {"Runtime Error"}, out[-8000:]
    assert not _unforeseen_failures(out), out[-8000:]
    assert re.search(r"\d+ generated", out), out[-3000:]
    assert "Traceback" not in server.output()


CONTEXT_TOO_SHORT = "the model's context is"


def _unforeseen_failures(out: str) -> list[str]:
    """Each failing operation's report, but those whose only failures are
    schema-valid bodies refused as longer than the context."""
    if "Failures:" not in out:
        return []
    failures = out.split("= FAILURES =")[-1].split("Failures:")[0]  # not the Errors section
    reports = re.split(r"^_{5,} [A-Z]+ \S+ _{5,}$", failures, flags=re.M)[1:]
    return [r for r in reports
            if set(re.findall(r"^- (ST\d+)", r, re.M)) != {"ST202"} or CONTEXT_TOO_SHORT not in r
            or len(re.findall(r"^\[400\]", r, re.M)) != r.count(CONTEXT_TOO_SHORT)]


def test_openapi_says_the_served_model_s_bounds(server):
    """A generative model's server lists no pooling route, and its token ids,
    alternatives and new tokens are bounded by the model (openapi_limits)."""
    doc = httpx.get(server.url + "/openapi.json").json()
    assert "/v1/embeddings" not in doc["paths"] and "/v1/completions" in doc["paths"]
    props = doc["components"]["schemas"]["CompletionRequest"]["properties"]
    assert props["stop_token_ids"]["anyOf"][0]["items"]["maximum"] == 511  # tiny: 512 ids
    assert props["max_tokens"]["maximum"] == 128  # --max-model-len
    assert props["top_p"]["exclusiveMinimum"] == 0
    assert {"minimum": 1} == {k: v for k, v in props["n"].items() if k == "minimum"}
    assert "x-limit" not in json.dumps(doc) and '"ge"' not in json.dumps(doc)
    r = httpx.post(server.url + "/v1/embeddings", json={"input": "x"})  # still a clear 400
    assert r.status_code == 400 and "generative model" in r.json()["error"]["message"]


def test_classify_refuses_bad_bodies_in_one_line(server):
    """/classify, left out of schemathesis above: wrong bodies are 400s on a
    generative server, never a 5xx."""
    for body in ({"input": "x"}, {"input": [None]}, {}, {"input": {"a": [1, [2]]}}, []):
        r = httpx.post(server.url + "/classify", json=body)
        assert r.status_code in (400, 404) and "\n" not in r.json()["error"]["message"], r.text


def test_probes_and_methods_as_upstream(server):
    for path in ("/health", "/ping"):
        r = httpx.get(server.url + path)
        assert (r.status_code, r.content) == (200, b"")  # as vLLM's: no body
    r = httpx.request("TRACE", server.url + "/health")
    assert r.status_code == 405 and r.headers["allow"] == "GET", r.headers
    assert r.json()["error"]["code"] == 405
    r = httpx.request("TRACE", server.url + "/ping")
    assert sorted(r.headers["allow"].split(", ")) == ["GET", "POST"]
    paths = httpx.get(server.url + "/openapi.json").json()["paths"]
    completions = paths["/v1/completions"]["post"]["responses"]
    assert {"200", "400", "401", "404", "413", "503"} <= set(completions)
    assert "422" not in completions and "text/event-stream" in completions["200"]["content"]
