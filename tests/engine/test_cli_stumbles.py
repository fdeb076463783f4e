"""Small things a user runs into first: `engine --version`, `engine env | head -1`,
a malformed JSON body, a body without its Content-Type, a model id that is not there,
--gpu-memory-utilization."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from engine import cli

REPO = Path(__file__).resolve().parents[2]


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


def _app(api_key=None):
    from fastapi.testclient import TestClient

    from engine.entrypoints.openai.api_server import build_app
    from engine.entrypoints.openai.metrics import Metrics
    from engine.entrypoints.openai.serving_engine import ServeOptions

    llm = types.SimpleNamespace(tokenizer=None, model_config=types.SimpleNamespace(vocab_size=8),
                                dead=None, pooling_tasks=())
    state = types.SimpleNamespace(api_key=api_key, llm=llm, metrics=Metrics("m"),
                                  model_names=["m"], max_body_bytes=None,
                                  options=ServeOptions(), lora=None)
    return TestClient(build_app(state))


def test_malformed_json_names_no_field():
    client = _app()
    r = client.post("/v1/completions", content=b'{"prompt": "a", "max_tokens": }',
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] is None
    assert err["message"].startswith("the request body is not valid JSON: ")
    assert "at byte" in err["message"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/tokenize",
                                  "/detokenize"])
@pytest.mark.parametrize("content_type", [None, "application/x-www-form-urlencoded",
                                          "text/plain"])
def test_a_body_without_json_content_type_names_the_header(path, content_type):
    """As upstream's validate_json_request: a 400 (OpenAI-shaped) naming the header,
    where pydantic would say 'Input should be a valid dictionary'."""
    headers = {"Content-Type": content_type} if content_type else {}
    r = _app().post(path, content=b'{"prompt": "a", "max_tokens": 2}', headers=headers)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "BadRequestError" and err["code"] == 400 and err["param"] is None
    assert "'Content-Type: application/json'" in err["message"]
    assert (repr(content_type) if content_type else "none was sent") in err["message"]
    assert "dictionary" not in err["message"]


@pytest.mark.parametrize("content_type", ["application/json", "Application/JSON; charset=utf-8"])
def test_json_content_type_passes_to_the_body_checks(content_type):
    r = _app().post("/v1/completions", content=b'{"prompt": "a", "max_tokens": "x"}',
                    headers={"Content-Type": content_type})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens", r.text


def test_the_key_is_checked_before_the_content_type():
    r = _app(api_key="k").post("/v1/completions", content=b"{}",
                               headers={"Content-Type": "text/plain"})
    assert r.status_code == 401, r.text


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


def _checkpoint(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "README.md"):
        (model / name).write_text("{}")
    return model


def test_a_model_file_it_cannot_read_is_one_line_naming_it_and_the_fix(monkeypatch, tmp_path):
    """save_pretrained leaves files 0600; a container's user is not their owner. The
    kernel's answer is faked where the tests run as root (root reads every file)."""
    from engine import model_source

    model = _checkpoint(tmp_path)
    (model / "model.safetensors").chmod(0o600)
    (model / "README.md").chmod(0o000)  # the engine never opens it: not checked
    real_access = os.access
    unreadable = {str(model / "model.safetensors"), str(model / "README.md")}
    monkeypatch.setattr(model_source.os, "access",
                        lambda p, mode: str(p) not in unreadable and real_access(p, mode))
    with pytest.raises(ValueError) as exc:
        model_source.resolve_model(model)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith(f"cannot read the model file {model / 'model.safetensors'} "
                          f"(mode 0600, owner uid {os.getuid()}) as uid {os.getuid()}: ")
    assert "chmod -R a+rX" in msg and "--user $(id -u):$(id -g)" in msg
    unreadable.discard(str(model / "model.safetensors"))
    assert model_source.resolve_model(model) == model
    unreadable.add(str(model))
    with pytest.raises(ValueError, match=r"cannot read the model folder .*model \(mode 0"):
        model_source.resolve_model(model)


@pytest.mark.skipif(os.getuid() == 0, reason="root reads every file")
def test_an_unreadable_model_file_for_real(tmp_path):
    from engine.model_source import resolve_model

    model = _checkpoint(tmp_path)
    (model / "config.json").chmod(0)
    with pytest.raises(ValueError, match="cannot read the model file .*config.json"):
        resolve_model(model)


def test_a_streamed_answer_into_head_ends_quietly():
    """`engine complete ... | head -c 80`: the command's writes meet a closed pipe."""
    probe = ("import sys\nfrom engine import cli\n"
             "def talk(args):\n    for _ in range(10_000):\n"
             "        sys.stdout.write('word ' * 20); sys.stdout.flush()\n    return 0\n"
             "cli.COMMANDS['complete'] = talk\n"
             "sys.exit(cli.main(['complete', '-q', 'hi']))\n")
    proc = subprocess.Popen([sys.executable, "-c", probe], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(80)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


@pytest.mark.parametrize("argv, usage, hint", [
    (["serve", "m", "--prot", "8000"], "engine serve", "did you mean --port?"),
    (["serve", "m", "--max-model-lenght=64"], "engine serve", "did you mean --max-model-len?"),
    (["serv", "m"], "engine", "did you mean 'serve'?"),
    (["frobnicate"], "engine", "choose from generate"),
])
def test_a_mistyped_command_or_flag_gets_its_own_usage_and_a_guess(capsys, argv, usage, hint):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert f"usage: {usage} " in err and hint in err, err


def test_ctrl_c_before_a_command_handles_it_is_one_line(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, "env", interrupted)
    assert cli.main(["env"]) == 130
    assert capsys.readouterr().err.strip() == "engine env: interrupted"


SWALLOWS_CTRL_C = """
import time, sys
from engine import cli

def swallowing(args):  # as torch's import does: C code clears the KeyboardInterrupt
    print("ready", flush=True)
    try:
        time.sleep(30)
    except BaseException:
        pass
    time.sleep(30)
    return 0

cli.COMMANDS["env"] = swallowing
sys.exit(cli.main(["env"]))
"""


def test_ctrl_c_that_a_library_swallows_still_ends_the_command_within_a_second():
    import signal
    import time

    p = subprocess.Popen([sys.executable, "-c", SWALLOWS_CTRL_C], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert p.stdout.readline().strip() == "ready"
        t0 = time.monotonic()
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=20) == 130
        took = time.monotonic() - t0
        assert took < 10, took  # the watchdog's 1 s, not the command's 30 s
        assert p.stderr.read().strip() == "engine env: interrupted"
    finally:
        p.kill()
        p.wait()


def test_cli_main_in_process_leaves_the_sigint_handler_as_it_was(monkeypatch):
    import signal

    before = signal.getsignal(signal.SIGINT)
    monkeypatch.setitem(cli.COMMANDS, "env", lambda args: 0)
    assert cli.main(["env"]) == 0
    assert signal.getsignal(signal.SIGINT) is before
