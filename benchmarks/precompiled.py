"""Precompiled mode against the floor of any editable install, same run.

    python benchmarks/precompiled.py [--repeat 3] [--check]

In a clone of HEAD whose commit has its cpu wheel published to a local HTTP
index, with torch already in the target environment and uv's cache warm:
  empty    VLLM_TARGET_DEVICE=empty uv pip install -e .   (compiles and fetches nothing)
  cold     VLLM_USE_PRECOMPILED=1 uv pip install -e .     (download cache empty)
  warm     the same with the download cache warm
  source   VLLM_TARGET_DEVICE=cpu uv pip install -e .     (a real build, build isolation on)
  wheel    uv pip install <the wheel>                      (for context)
Targets: cold/empty <= 1.3, warm/empty <= 1.1, source/warm >= 10.
"""
from __future__ import annotations

import os
import sys

# Run as a script, this folder would come first on the import path, and its
# bisect.py would shadow the standard library's; the repository root goes there.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import threading
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(1, str(REPO / "tests"))

from benchmarks.common import Targets, add_check_argument  # noqa: E402
from benchmarks.common import timed_command as timed  # noqa: E402
from helpers import torch_wheelhouse  # noqa: E402
from tools.target import torch_requirement  # noqa: E402
from tools.variants import get_variant  # noqa: E402
from wheel_index.publish import publish  # noqa: E402
from wheel_index.server import make_server  # noqa: E402
from wheel_index.storage import open_storage  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    add_check_argument(p)
    args = p.parse_args()
    bindir = Path(sys.executable).parent
    uv = shutil.which("uv", path=str(bindir)) or "uv"
    links = ["--find-links", str(torch_wheelhouse())]
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        src = tmp / "src"
        subprocess.run(["git", "clone", "-q", str(REPO), str(src)], check=True)
        base_env = {**os.environ, "PYTHON": sys.executable, "UV": uv}
        out = tmp / "wheelhouse"
        subprocess.run(["bash", str(src / "ci" / "build-wheel.sh"), "cpu", str(out)], env=base_env,
                       check=True, capture_output=True)
        (wheel,) = out.glob("*.whl")
        commit = json.loads(zipfile.ZipFile(wheel).read("engine/_build_info.json"))["git_commit"]
        idx = tmp / "index"
        publish(open_storage(str(idx)), commit, [wheel], commit_time="1", log=lambda m: None)
        server = make_server(idx)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}"

        venv = tmp / "venv"
        subprocess.run([uv, "venv", "-q", str(venv)], check=True)
        py = str(venv / "bin" / "python")
        torch_pin = torch_requirement(get_variant("cpu"))  # requirements/torch/cpu.txt
        subprocess.run([uv, "pip", "install", "-q", "--python", py, torch_pin, "numpy",
                        "packaging", *links], check=True)
        install = [uv, "pip", "install", "-q", "--python", py, "-e", str(src), *links,
                   "--reinstall-package", "vllm-engine"]

        def env(**kw):
            return {**base_env, **kw}

        # warm uv's cache (build requirements of both modes) before measuring
        timed(install, env(VLLM_TARGET_DEVICE="empty"))
        timed(install, env(VLLM_USE_PRECOMPILED="1", VLLM_PRECOMPILED_WHEEL_INDEX=url,
                           VLLM_PRECOMPILED_CACHE=str(tmp / "c0")))
        empty, cold, warm = [], [], []
        for i in range(args.repeat):
            empty.append(timed(install, env(VLLM_TARGET_DEVICE="empty")))
            cache = str(tmp / f"cache{i}")
            pre = env(VLLM_USE_PRECOMPILED="1", VLLM_PRECOMPILED_WHEEL_INDEX=url,
                      VLLM_PRECOMPILED_CACHE=cache)
            cold.append(timed(install, pre))
            warm.append(timed(install, pre))
        # a first build of this checkout: no compiler cache on PATH
        source = timed(install, env(VLLM_TARGET_DEVICE="cpu", PATH="/usr/local/bin:/usr/bin:/bin"))
        plain = timed([uv, "pip", "install", "-q", "--python", py, str(wheel), *links,
                       "--reinstall-package", "vllm-engine"], base_env)
        server.shutdown()
    e, c, w = (statistics.median(x) for x in (empty, cold, warm))
    print(f"editable installs, median of {args.repeat}; torch in the environment, uv cache warm")
    print(f"  empty (the floor)          {e:6.2f} s   1.00x")
    print(f"  precompiled, cache cold    {c:6.2f} s   {c / e:4.2f}x")
    print(f"  precompiled, cache warm    {w:6.2f} s   {w / e:4.2f}x")
    print(f"  source build (cpu)         {source:6.2f} s   {source / w:5.1f}x the precompiled "
          "install")
    print(f"  uv pip install <wheel>     {plain:6.2f} s   (context)\n")
    targets = Targets()
    targets.record("precompiled, cold cache vs empty", c / e, 1.3, higher_is_better=False)
    targets.record("precompiled, warm cache vs empty", w / e, 1.1, higher_is_better=False)
    targets.record("source build vs precompiled (warm)", source / w, 10.0)
    return targets.finish(args.check, record_as="precompiled" if args.record else None)


if __name__ == "__main__":
    sys.exit(main())
