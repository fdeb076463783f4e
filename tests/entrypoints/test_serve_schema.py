"""schemathesis over the server's own /openapi.json (issue 38): with every
check on, no generated request gets a server error, an undocumented status
or content type, a body that breaks its schema, or a 405 without `Allow`.
positive_data_acceptance is left out: the schema cannot say everything a
request must be (a token id inside the model's vocabulary, continue_final_message
without add_generation_prompt), so a schema-valid body may get its documented
400. Bounded: a fixed seed and a few examples per operation (about a minute)."""
from __future__ import annotations

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
        [ST, "run", server.url + "/openapi.json", "--checks", "all",
         "--exclude-checks", "positive_data_acceptance", "--max-examples", "10",
         "--seed", "38", "--request-timeout", "30", "--workers", "2", "--no-color"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    out = r.stdout
    # schemathesis 4.32 sometimes crashes generating a pooling route's recursive input
    # schema ("Runtime Error ... Inconsistent results": the tool's, not a response's);
    # any failure of a check, or any other error (a timeout, a dropped connection), fails
    errors = re.findall(r"^  \S+ (.+): \d+$", out.split("Errors:")[1].split("\n\n")[0],
                        re.M) if "Errors:" in out else []
    assert "Failures:" not in out and set(errors) <= {"Runtime Error"}, out[-8000:]
    assert re.search(r"(\d+) generated, \1 passed", out), out[-3000:]
    assert "Traceback" not in server.output()


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
