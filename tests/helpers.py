"""Shared pieces of the end-to-end tests: throwaway virtual environments, a
local mirror of PyTorch's wheel index, and a copy of the source tree."""
from __future__ import annotations

import hashlib
import http.server
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
UV = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))


def torch_cpu_pin() -> str:
    """The cpu variant's torch, "torch==<version>+cpu", from requirements/torch/cpu.txt
    (its one home). A function, not a constant: the smoke test imports this module
    where only engine and torch are installed."""
    from tools.target import torch_requirement
    from tools.variants import get_variant

    return torch_requirement(get_variant("cpu"))


def torch_cpu_version() -> str:
    return torch_cpu_pin().split("==", 1)[1]


def __getattr__(name: str) -> str:  # TORCH_CPU_PIN, TORCH_CPU_VERSION for the tests' imports
    if name == "TORCH_CPU_PIN":
        return torch_cpu_pin()
    if name == "TORCH_CPU_VERSION":
        return torch_cpu_version()
    raise AttributeError(name)


def dev_tool(name: str) -> Path:
    """A command-line tool of the dev environment (beside this Python, else on PATH);
    the calling test is skipped, naming the tool, where it is not installed."""
    import pytest

    here = Path(sys.executable).parent / name
    path = here if here.exists() else shutil.which(name)
    if not path:
        pytest.skip(f"{name} is not installed (requirements/dev.txt; run ci/setup-dev.sh)")
    return Path(path)


def run(cmd, *, env=None, cwd=None, check=True, timeout=1800) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([str(c) for c in cmd], env=full_env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n"
                             f"--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    return proc


def torch_wheelhouse() -> Path:
    """The folder holding the cpu torch wheel (pip's find-links here)."""
    candidates = [os.environ.get("VLLM_TORCH_FIND_LINKS")]
    try:
        candidates.append(subprocess.run([sys.executable, "-m", "pip", "config", "get",
                                          "global.find-links"], capture_output=True, text=True,
                                         timeout=60).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    for c in filter(None, candidates):
        for folder in c.split():
            if list(Path(folder).glob(f"torch-{torch_cpu_version()}-*.whl")):
                return Path(folder)
    raise AssertionError(f"no torch-{torch_cpu_version()} wheel found: set "
                         "VLLM_TORCH_FIND_LINKS to the folder that holds it")


class Server:
    """A static file server on 127.0.0.1 in a thread."""

    def __init__(self, root: Path):
        handler = lambda *a, **kw: http.server.SimpleHTTPRequestHandler(  # noqa: E731
            *a, directory=str(root), **kw)
        http.server.SimpleHTTPRequestHandler.log_message = lambda *a: None
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class PlusAsSpaceServer(Server):
    """A static server that reads '+' in a URL path as a space, as S3's REST and
    website endpoints (and CDNs in front of them) do."""

    def __init__(self, root: Path):
        class Handler(http.server.SimpleHTTPRequestHandler):
            def translate_path(self, path):
                return super().translate_path(path.replace("+", "%20"))

            def log_message(self, *args):
                pass

        handler = lambda *a, **kw: Handler(*a, directory=str(root), **kw)  # noqa: E731
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()


def build_torch_mirror(root: Path, wheelhouse: Path) -> Path:
    """A PEP 503 mirror laid out like PyTorch's: <root>/cpu/torch/index.html."""
    page = root / "cpu" / "torch"
    page.mkdir(parents=True)
    links = []
    for whl in sorted(wheelhouse.glob(f"torch-{torch_cpu_version()}-*.whl")):
        os.symlink(whl, page / whl.name)
        digest = hashlib.sha256(whl.read_bytes()).hexdigest()
        links.append(f'<a href="{whl.name}#sha256={digest}">{whl.name}</a>')
    (page / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links)
                                     + "\n</body></html>\n")
    (root / "cpu" / "index.html").write_text('<html><body><a href="torch/">torch</a></body></html>')
    return root


def make_venv(path: Path, *packages: str, extra_args=()) -> Path:
    run([UV, "venv", "-q", "--python", sys.executable, path])
    python = path / "bin" / "python"
    if packages:
        run([UV, "pip", "install", "-q", "--python", python, *packages, *extra_args])
    return python


def copy_source_tree(dest: Path) -> Path:
    """The working tree as it is (uncommitted changes included), with its git
    metadata, without build outputs or environments."""
    top_level = {".venv", ".venvs", "build", "dist", "wheelhouse", "index", ".pytest_cache"}
    anywhere = shutil.ignore_patterns("__pycache__", "*.so")

    def ignore(folder, names):
        skip = set(anywhere(folder, names))
        if Path(folder) == REPO:
            skip |= top_level & set(names)
        return skip

    shutil.copytree(REPO, dest, ignore=ignore, symlinks=True)
    return dest


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_wheel(folder: Path, version: str, *, commit: str = "0" * 40, variant: str | None = None,
               platform: str = "manylinux_2_34_x86_64", body: str = "VALUE = 1\n",
               build_info: bool = True, name: str = "vllm_engine",
               info: dict | None = None) -> Path:
    """A small but well-formed vllm-engine wheel (pure Python, with a build-info
    record) for tests that need many of them."""
    import base64
    import json
    import zipfile

    if variant is None:  # the local segment's last part (even a bad one, for the tests of
        # refusals); a plain release is the main CUDA variant
        from tools.variants import main_cuda_variant

        variant = version.split("+")[1].split(".")[-1] if "+" in version else \
            main_cuda_variant().label
    dist_info = f"{name}-{version}.dist-info"
    files = {
        "engine/__init__.py": body,
        f"{dist_info}/METADATA": (f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\n"
                                  f"Version: {version}\nRequires-Python: >=3.10\n"),
        f"{dist_info}/WHEEL": ("Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: false\n"
                               f"Tag: cp38-abi3-{platform}\n"),
    }
    if build_info:
        files["engine/_build_info.json"] = json.dumps(
            {"variant": variant, "device": variant, "git_commit": commit,
             "torch_version": None, "code_paths": [], **(info or {})})
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = "\n".join(record) + "\n"
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{name}-{version}-cp38-abi3-{platform}.whl"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, text in files.items():
            # a fixed timestamp: the same arguments always give the same bytes
            zf.writestr(zipfile.ZipInfo(path, date_time=(2026, 1, 1, 0, 0, 0)), text,
                        compress_type=zipfile.ZIP_DEFLATED)
    return out


class MotoServer:
    """A real S3-API server (moto) in its own process on 127.0.0.1."""

    def __init__(self):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1",
                                      "-p", str(self.port)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        import time
        import urllib.request

        for _ in range(200):
            try:
                urllib.request.urlopen(self.url + "/moto-api/", timeout=1)
                return
            except OSError:
                time.sleep(0.1)
        self.close()
        raise AssertionError("moto server did not start")

    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


WORDS = ("the a of to and in is it you that he was for on are with as his they be at one have "
         "this from or had by hot word but what some we can out other were all there when up "
         "use your how said an each she which do their time if will way about many then them "
         "write would like so these her long make thing see him two has look more day could go "
         "come did number sound no most people my over know water than call first who may down "
         "side been now find").split()


def make_checkpoint(folder: Path, model_type: str = "llama", *, seed: int = 0, hidden: int = 64,
                    layers: int = 2, heads: int = 4, kv_heads: int = 2, inter: int = 128,
                    max_pos: int = 512, vocab_size: int | None = None,
                    init_std: float = 0.2, **config_extra) -> Path:
    """A small random Llama-family checkpoint (transformers, fixed seed) with a
    word-level tokenizer.json built by the tokenizers library; config_extra
    goes to the config (the MoE families' expert counts)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    tok.decoder = decoders.WordPiece(prefix="##")
    cfg_cls, model_cls = {
        "llama": ("LlamaConfig", "LlamaForCausalLM"),
        "mistral": ("MistralConfig", "MistralForCausalLM"),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
        "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
        "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    }[model_type]
    config = getattr(transformers, cfg_cls)(
        vocab_size=vocab_size or len(vocab), hidden_size=hidden, intermediate_size=inter,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=max_pos, bos_token_id=1, eos_token_id=2,
        tie_word_embeddings=False, head_dim=hidden // heads, **config_extra)
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():  # random weights large enough that logits are not near-ties
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, init_std)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


def app_in_process(model: Path, max_waiting: int | None = None, **engine_args):
    """(the server's FastAPI app, its AsyncLLM) over an engine core built in
    this process and stepped by a thread of its own behind the same ZMQ
    sockets as the server's core process (llm.core reaches into it); run
    llm.run() in the loop that serves the app (httpx's ASGITransport) for
    requests to be answered, llm.shutdown() to stop both."""
    import time

    llm = async_llm_in_process(model, max_waiting, **engine_args)
    from engine.entrypoints import chat_utils
    from engine.entrypoints.openai.api_server import ServerState, build_app

    state = ServerState(llm=llm, model_names=["tiny"], model_dir=Path(model), metrics=llm.stats,
                        api_key=None, chat_template=chat_utils.load_template(Path(model), None),
                        special_tokens=chat_utils.special_tokens(Path(model)),
                        max_model_len=llm.max_model_len, created=int(time.time()))
    return build_app(state), llm


def async_llm_in_process(model: Path, max_waiting: int | None = None, core=None, **engine_args):
    """An AsyncLLM (with the server's metrics) over an EngineCore in this
    process, stepped by a thread (engine.core.core_client.core_in_thread)."""
    from engine.core.async_llm import AsyncLLM
    from engine.core.core_client import AsyncMPClient, core_in_thread
    from engine.core.engine_core import EngineCore
    from engine.core.input_processor import load_tokenizer
    from engine.entrypoints.openai.metrics import Metrics

    engine_args = {"block_size": 32, "num_kv_blocks": 32, "max_model_len": 256,
                   "bind_threads": False, **engine_args}
    if core is None:
        core = EngineCore(model, "float32", **engine_args)
    client = AsyncMPClient(core_in_thread(core))
    ready = client.wait_ready()
    llm = AsyncLLM(client, ready, core.config, load_tokenizer(core.path), Metrics("tiny"),
                   max_waiting=max_waiting)
    llm.core = core
    return llm


def http_status(url: str) -> int:
    """The status of a GET, 0 when nothing answers."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def wait_for_health(proc, url: str, output, timeout: float = 180) -> None:
    """Until a starting `engine serve` at url answers /health 200; an
    AssertionError with output() when it exits first or takes longer."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"engine serve exited {proc.returncode}:\n{output()}")
        if http_status(url + "/health") == 200:
            return
        time.sleep(0.2)
    raise AssertionError(f"engine serve did not come up in {timeout:.0f} s:\n{output()}")


def assert_dies_with_503(proc, url: str, log: Path, needle: str) -> None:
    """A server whose rank or replica was just killed: /health 503 within 5 s,
    then exit 1 with `needle` (the rank named) in its log."""
    import time

    t0 = time.monotonic()
    while http_status(url + "/health") != 503:
        assert time.monotonic() - t0 < 5, "no 503 on /health within 5 s"
        time.sleep(0.1)
    assert proc.wait(timeout=30) == 1
    assert needle in log.read_text()


class Killed(BaseException):
    """A publisher killed mid-write: not an Exception, so no handler of the
    publisher's own turns it into an orderly failure."""


class Dying:
    """A storage that dies after a number of writes, as a killed publisher would."""

    def __init__(self, inner, writes_left):
        self.inner, self.left = inner, writes_left

    def __getattr__(self, name):
        attr = getattr(self.inner, name)
        if name in ("write_atomic", "upload_file"):
            def write(*a):
                if self.left == 0:
                    raise Killed
                self.left -= 1
                return attr(*a)
            return write
        return attr


def nightly(storage) -> str:
    """The commit a wheel index's nightly (cpu) shows."""
    import json

    return json.loads(storage.read("nightly/cpu/metadata.json"))["commit"]
