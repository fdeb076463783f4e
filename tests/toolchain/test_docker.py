"""The cpu image, built by ci/docker-build.sh and run with a real Docker engine:
it serves a tiny model with the guide's `docker run` options and answers as
offline generation does, from a folder or from the host's Hugging Face cache
mounted as the guide mounts it; a model file it cannot read is one line; without
CAP_SYS_NICE it loses only NUMA binding (one warning); its LD_PRELOAD names files
that exist; a bad VLLM_CPU_KVCACHE_SPACE stops it before the model loads, with one
line.

Needs a Docker daemon (ci/setup-docker.sh, which .ci/run calls): without one
these tests skip with the reason, unless VLLM_REQUIRE_DOCKER or CI is set."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import pytest
from helpers import REPO, free_port, run

pytestmark = [pytest.mark.slow, pytest.mark.docker]

TARGET = "vllm-engine-openai"
# One fixed tag, so repeated runs replace the image instead of piling up.
TAG = f"vllm-engine/{TARGET}:test"
# The CPU installation guide's options (the port published on loopback only).
GUIDE = ["--cap-add", "SYS_NICE", "--security-opt", "seccomp=unconfined", "--shm-size=4g",
         "-e", "VLLM_CPU_KVCACHE_SPACE=1"]
PROMPT = "Once upon a time there was a small engine"
HF_HOME = "/root/.cache/huggingface"
MAX_TOKENS = 16


def docker(*args, check=True, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check,
                          timeout=timeout)


def daemon_missing() -> str | None:
    if shutil.which("docker") is None:
        return "no docker client on PATH (ci/setup-docker.sh installs one)"
    try:
        out = docker("info", "--format", "{{.ServerVersion}}", check=False, timeout=30)
    except subprocess.TimeoutExpired:
        return "the Docker daemon did not answer within 30 s"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no answer"])[-1]
        return f"no Docker daemon reachable ({last}); run ci/setup-docker.sh"
    return None


def start_daemon() -> str:
    """Run ci/setup-docker.sh (it starts dockerd when none answers) and return the
    tail of what it printed: a daemon that died or never came up since .ci/run's
    set-up is started again here, and a failure names its cause."""
    try:
        out = subprocess.run(["bash", str(REPO / "ci" / "setup-docker.sh")], capture_output=True,
                             text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return "ci/setup-docker.sh took over 900 s"
    return "\n".join((out.stdout + out.stderr).strip().splitlines()[-8:])


@pytest.fixture(scope="module")
def image() -> str:
    reason = daemon_missing()
    if reason and (os.environ.get("VLLM_REQUIRE_DOCKER") or os.environ.get("CI")):
        log = Path(os.environ.get("VLLM_DOCKERD_LOG", "/var/log/vllm-engine-dockerd.log"))
        last = log.read_text(errors="replace").splitlines()[-5:] if log.is_file() else []
        warnings.warn(f"no Docker daemon answered ({reason}); starting it again. "
                      f"Its log ended: {' | '.join(last) or 'no log'}")
        setup = start_daemon() if os.geteuid() == 0 else "not root: cannot start dockerd"
        reason = daemon_missing()
        if reason:
            pytest.fail(f"Docker is required here but {reason}; ci/setup-docker.sh said:\n{setup}")
    if reason:
        pytest.skip(reason)
    build = subprocess.run(["bash", str(REPO / "ci" / "docker-build.sh"), TARGET, "--tag", TAG],
                           capture_output=True, text=True, timeout=3000)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    print(build.stdout.strip().splitlines()[-1])  # the image's size
    return TAG


@pytest.fixture(scope="module")
def model_dir(image, tmp_path_factory) -> Path:
    """A tiny random Llama, written by the image's own `engine make-tiny-model`."""
    root = tmp_path_factory.mktemp("docker-models")
    root.chmod(0o777)  # the image runs as a non-root user
    docker("run", "--rm", "-v", f"{root}:/models", "--entrypoint", "engine", image,
           "make-tiny-model", "/models/tiny")
    return root


class Container:
    """A detached server container published on 127.0.0.1; removed on exit."""

    def __init__(self, image: str, model_dir: Path | None, options: list[str],
                 model: str = "/models/tiny"):
        self.port, self.model = free_port(), model
        mount = ["-v", f"{model_dir}:/models:ro"] if model_dir else []
        self.id = docker("run", "-d", *options, "-p", f"127.0.0.1:{self.port}:8000", *mount,
                         image, model, "--dtype", "float32").stdout.strip()
        self.url = f"http://127.0.0.1:{self.port}"

    def logs(self) -> str:
        out = docker("logs", self.id, check=False)
        return out.stdout + out.stderr

    def wait_healthy(self, limit: float = 600) -> None:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            state = docker("inspect", "--format", "{{.State.Running}}", self.id).stdout.strip()
            assert state == "true", f"the container stopped:\n{self.logs()[-4000:]}"
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(1)
        pytest.fail(f"/health never answered 200:\n{self.logs()[-4000:]}")

    def complete(self) -> str:
        import openai

        client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0,
                               timeout=300)
        out = client.completions.create(model=self.model, prompt=PROMPT,
                                        max_tokens=MAX_TOKENS, temperature=0)
        return out.choices[0].text

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        docker("rm", "-f", self.id, check=False)


@pytest.fixture(scope="module")
def offline_text(image, model_dir) -> str:
    """Greedy generation with the offline API, in the same image."""
    code = ("import json; from engine import LLM, SamplingParams; "
            "llm = LLM('/models/tiny', dtype='float32'); "
            f"o = llm.generate([{PROMPT!r}], SamplingParams(temperature=0, max_tokens={MAX_TOKENS}))"
            "[0].outputs[0]; print(json.dumps(o.text))")
    out = docker("run", "--rm", *GUIDE, "-v", f"{model_dir}:/models:ro", "--entrypoint", "python",
                 image, "-c", code)
    return json.loads(out.stdout.strip().splitlines()[-1])


def numa_warnings(logs: str) -> list[str]:
    return [line for line in logs.splitlines() if "WARNING" in line and "NUMA" in line]


def test_image_is_small_non_root_with_healthcheck_and_preloads(image):
    cfg = json.loads(docker("image", "inspect", "--format", "{{json .Config}}", image).stdout)
    uid = docker("run", "--rm", "--entrypoint", "id", image, "-u").stdout.strip()
    assert cfg["User"] and uid != "0"  # not root
    # the Hugging Face cache where upstream's image (and the guide's -v) has it, writable
    # by the image's user and by any other (--user $(id -u):$(id -g))
    assert f"HF_HOME={HF_HOME}" in cfg["Env"]
    for user in ([], ["--user", "4321:4321"]):
        docker("run", "--rm", *user, "--entrypoint", "sh", image, "-c",
               f"mkdir -p {HF_HOME}/hub && touch {HF_HOME}/hub/x")
    assert cfg["Entrypoint"][:2] == ["engine", "serve"]
    assert any("/health" in part for part in cfg["Healthcheck"]["Test"])
    preload = next(e.split("=", 1)[1] for e in cfg["Env"] if e.startswith("LD_PRELOAD="))
    names = [Path(p).name for p in preload.split(":")]
    assert names == ["libtcmalloc_minimal.so.4", "libiomp5.so"]
    # Every file exists and is a loadable library inside the image; the wheel,
    # not a source tree, is what is installed; the engine sees the preloads.
    check = ("import ctypes, os, engine, engine.platforms.cpu_preload as p; "
             "[ctypes.CDLL(f) for f in os.environ['LD_PRELOAD'].split(':')]; "
             "assert not p.is_source_build(); assert all(n in os.environ['LD_PRELOAD'] "
             "for n in p.wanted(False)); print(engine.BUILD_INFO.variant)")
    out = docker("run", "--rm", "--entrypoint", "python", image, "-c", check)
    assert out.stdout.strip().splitlines()[-1] == "cpu"
    size = int(docker("image", "inspect", "--format", "{{.Size}}", image).stdout)
    assert size < 1_500_000_000, f"the image grew to {size / 1e6:.0f} MB"
    # Only the runtime: no compiler, no build environment, no uv.
    absent = docker("run", "--rm", "--entrypoint", "sh", image, "-c",
                    "command -v gcc g++ cc uv; ls -d /src /opt/tools 2>/dev/null", check=False)
    assert absent.stdout.strip() == ""


def test_guide_options_serve_the_offline_greedy_completion(image, model_dir, offline_text):
    with Container(image, model_dir, GUIDE) as c:
        c.wait_healthy()
        assert c.complete() == offline_text
        health_cmd = json.loads(docker("inspect", "--format", "{{json .Config.Healthcheck.Test}}",
                                       c.id).stdout)
        assert health_cmd[0] == "CMD"
        docker("exec", c.id, *health_cmd[1:])  # the HEALTHCHECK itself passes
        assert numa_warnings(c.logs()) == []  # SYS_NICE + unconfined: NUMA binding works


def test_without_sys_nice_it_serves_and_warns_once(image, model_dir, offline_text):
    plain = [o for o in GUIDE if o not in ("--cap-add", "SYS_NICE", "--security-opt",
                                           "seccomp=unconfined")]
    with Container(image, model_dir, plain) as c:
        c.wait_healthy()
        assert c.complete() == offline_text
        warnings = numa_warnings(c.logs())
        assert len(warnings) == 1, c.logs()[-4000:]
        assert "get_mempolicy: Operation not permitted" in warnings[0]


def _hf_cache(model: Path, root: Path, repo_id: str) -> Path:
    """A Hugging Face cache (HF_HOME) holding `model` as `repo_id`, laid out as
    `hf download` leaves it: blobs, a snapshot of links to them, refs/main."""
    rev = "0" * 40
    repo = root / "hub" / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(rev)
    (repo / "blobs").mkdir()
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    for f in model.iterdir():
        blob = repo / "blobs" / f"blob-{f.name}"
        shutil.copyfile(f, blob)
        blob.chmod(0o644)
        (snap / f.name).symlink_to(os.path.relpath(blob, snap))
    for d in [root, *root.rglob("*")]:
        if d.is_dir() and not d.is_symlink():
            d.chmod(0o755)
    return root


def test_the_guides_cache_mount_serves_a_hub_model(image, model_dir, offline_text, tmp_path):
    """The guide's line, `-v ~/.cache/huggingface:/root/.cache/huggingface ... IMAGE
    org/name`, with a cache folder of the host's root (not the image's user) and
    HF_HUB_OFFLINE=1, since the Hub is unreachable here."""
    cache = _hf_cache(model_dir / "tiny", tmp_path / "huggingface", "tiny-org/tiny-llama")
    options = [*GUIDE, "-v", f"{cache}:{HF_HOME}", "-e", "HF_HUB_OFFLINE=1"]
    with Container(image, None, options, model="tiny-org/tiny-llama") as c:
        c.wait_healthy()
        assert c.complete() == offline_text


def test_a_model_file_it_cannot_read_is_one_line(image, model_dir, tmp_path):
    """0600 files of another uid (save_pretrained's mode, the host's user): one line
    naming the file, the container's uid and the fix; the fix then serves."""
    model = tmp_path / "private"
    shutil.copytree(model_dir / "tiny", model)
    for f in model.iterdir():
        os.chown(f, 4242, 4242)
        f.chmod(0o600)
    model.chmod(0o755)
    out = docker("run", "--rm", *GUIDE, "-v", f"{model}:/models/tiny:ro", image, "/models/tiny",
                 check=False)
    logs = out.stdout + out.stderr
    assert out.returncode != 0 and "Traceback" not in logs, logs[-4000:]
    errors = [line for line in logs.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, logs[-4000:]
    assert errors[0].startswith("error: cannot read the model file /models/tiny/"), errors
    assert "(mode 0600, owner uid 4242) as uid 1000:" in errors[0]
    assert "--user $(id -u):$(id -g)" in errors[0] and "chmod" in errors[0]
    check = "from engine.model_source import resolve_model; print(resolve_model('/models/tiny'))"
    fixed = docker("run", "--rm", "--user", "4242:4242", "-v", f"{model}:/models/tiny:ro",
                   "--entrypoint", "python", image, "-c", check)
    assert fixed.stdout.strip().splitlines()[-1] == "/models/tiny"


def test_bad_kvcache_space_stops_the_container_with_one_line(image, model_dir):
    out = docker("run", "--rm", "-e", "VLLM_CPU_KVCACHE_SPACE=lots", "-v",
                 f"{model_dir}:/models:ro", image, "/models/tiny", check=False)
    logs = out.stdout + out.stderr
    assert out.returncode != 0
    errors = [line for line in logs.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith("error: VLLM_CPU_KVCACHE_SPACE='lots'"), logs
    assert "Traceback" not in logs
    assert "engine ready" not in logs and "Uvicorn running" not in logs  # before the model loads


def test_cuda_dockerfile_precompiled_path_takes_kernels_from_the_index(image, cpu_wheel, tmp_path):
    """docker/Dockerfile with VLLM_USE_PRECOMPILED=1: the build stage builds the
    Python part and takes this commit's kernels from a wheel index. Stand-ins,
    since no nvidia/cuda image is reachable here and a cu130 wheel takes longer
    than CI allows: the cpu variant (the session's cpu wheel, published into a
    folder index) and the local Debian base for both base images."""
    commit = run(["git", "rev-parse", "HEAD"], cwd=REPO).stdout.strip()
    index = tmp_path / "index"
    run([sys.executable, "-m", "wheel_index", "publish", "--index", index, "--commit", commit,
         cpu_wheel], cwd=REPO)
    base = run(["bash", "-c", "source ci/docker-lib.sh && echo $BASE_IMAGE"], cwd=REPO).stdout.strip()
    tag = "vllm-engine/vllm-engine-openai-cuda:test-precompiled"
    build = run(["bash", REPO / "ci" / "docker-build.sh", "vllm-engine-openai-cuda", "--tag", tag,
                 "--base", base, "--index", index, "--variant", "cpu", "--",
                 "--build-arg", f"BUILD_BASE_IMAGE={base}", "--build-arg", "PYTHON_VERSION=3.11",
                 "--build-arg", "VLLM_USE_PRECOMPILED=1"], check=False, timeout=3000)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    show = ("import json, engine, importlib.resources as r; "
            "print(json.dumps(json.loads((r.files('engine') / '_precompiled.json').read_text())))")
    out = docker("run", "--rm", "--entrypoint", "python", tag, "-c", show)
    used = json.loads(out.stdout.strip().splitlines()[-1])
    assert used["commit"] == commit and used["variant"] == "cpu"
    assert used["source"].startswith(f"/index/{commit}/cpu/")
    assert docker("run", "--rm", "--entrypoint", "id", tag, "-u").stdout.strip() != "0"
