"""Small things a user runs into first: `engine --version`, `engine env | head -1`,
a malformed JSON body, a model id that is not there, --gpu-memory-utilization."""
from __future__ import annotations

import argparse
import subprocess
import sys
import types
from pathlib import Path

import pytest

from engine import cli

REPO = Path(__file__).resolve().parent.parent


def test_version_is_printed_not_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("engine ") and out != "engine "


def test_engine_env_into_head_exits_quietly():
    proc = subprocess.Popen([sys.executable, "-m", "engine.cli", "env"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()  # as `head -1` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, err
    assert first.startswith(b"vllm_engine") and "BrokenPipeError" not in err and not err.strip()


def test_malformed_json_names_no_field():
    from fastapi.testclient import TestClient

    from engine.entrypoints.openai.api_server import build_app

    core = types.SimpleNamespace(tokenizer=None, config=types.SimpleNamespace(vocab_size=8))
    state = types.SimpleNamespace(api_key=None, llm=types.SimpleNamespace(core=core),
                                  metrics=None, model_names=["m"])
    client = TestClient(build_app(state))
    r = client.post("/v1/completions", content=b'{"prompt": "a", "max_tokens": }',
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] is None
    assert err["message"].startswith("the request body is not valid JSON: ")
    assert "at byte" in err["message"]


def test_a_model_id_not_in_the_cache_names_the_hf_command(monkeypatch, tmp_path):
    from engine.model_source import resolve_model

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ValueError, match=r"`hf download org/missing-model`") as exc:
        resolve_model("org/missing-model")
    assert "huggingface-cli" not in str(exc.value)


def test_gpu_memory_utilization_only_when_given():
    from engine.engine_args import gpu_memory

    assert gpu_memory(argparse.Namespace(gpu_memory_utilization=None)) == {}
    assert gpu_memory(argparse.Namespace(gpu_memory_utilization=0.5)) == {
        "gpu_memory_utilization": 0.5}
    p = argparse.ArgumentParser()
    cli.parallel_args(p)
    assert p.parse_args(["--gpu-memory-utilization", "0.7"]).gpu_memory_utilization == 0.7
