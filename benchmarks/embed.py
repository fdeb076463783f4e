"""Embeddings of many short texts (the usual retrieval load): this engine's
LLM.embed against sentence-transformers' encode() on the same random
MiniLM-L6-shaped BERT (384 hidden, 6 layers, mean pooling, normalized),
the same 1000 texts, the same torch and threads, in this one process, the
two taking turns (this machine's speed drifts over minutes); the fastest
round of each counts. The two answers are checked equal (cosine) first.

    python benchmarks/embed.py [--texts 1000] [--repeats 3] [--peer vllm] [--check] [--record]

Targets: texts/s >= 2x sentence-transformers' (its default batch of 32) and,
with --peer vllm, >= 1.0x vLLM 0.32.0's pooling runner (`LLM(runner="pooling")
.embed`, in its own venv and process; this engine then runs in a process of its
own too, on the same CPUs, the two taking turns). --check exits 1 on a missed
target."""
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse
import random
import tempfile
import time
from pathlib import Path

from benchmarks.common import Targets, add_check_argument, say_ready

TARGET_VS_ST, TARGET_VS_PEER = 2.0, 1.0
# all-MiniLM-L6-v2's shape, the most used small embedding model
MINILM = dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=6,
              num_attention_heads=12, max_position_embeddings=512)


def texts(n: int, seed: int = 0) -> list[str]:
    """n texts of 4 to 24 words: queries and short passages."""
    from engine.tiny_model import CORPUS

    words = " ".join(CORPUS).split()
    rng = random.Random(seed)
    return [" ".join(rng.choices(words, k=rng.randint(4, 24))) for _ in range(n)]


def child(kind: str, model: str, n: int) -> None:
    """One side in a process of its own: READY, then a RESULT per "embed" line."""
    import json

    if kind == "vllm":
        from vllm import LLM as Peer

        llm = Peer(model=model, runner="pooling", dtype="float32", max_model_len=512)
    else:
        from engine import LLM

        llm = LLM(model, dtype="float32")
    batch = texts(n)
    first = llm.embed(batch[:64])
    say_ready({"first": [list(map(float, o.outputs.embedding)) for o in first[:4]]})
    for _ in sys.stdin:
        t0 = time.perf_counter()
        llm.embed(batch)
        print("RESULT " + json.dumps({"seconds": time.perf_counter() - t0}), flush=True)


def versus_peer(a, path: Path, targets: Targets) -> None:
    """This engine against vLLM's pooling runner, each in its own process."""
    import numpy as np

    from benchmarks.common import Worker
    from benchmarks.peer import peer_env, require_peer

    env = {**peer_env(a.threads), "PYTHONPATH": str(Path(_HERE).parent)}
    cmd = ["--child", "", "--model", str(path), "--texts", str(a.texts)]
    sides = {}
    for name, py, kind in (("engine", sys.executable, "engine"),
                           ("vLLM", str(require_peer()), "vllm")):
        cmd[1] = kind
        sides[name] = Worker([py, __file__, *cmd], env, path.parent / f"{kind}.log",
                             f"{name} embedding run")
    try:
        ours, peer = (np.array(sides[k].ready["first"]) for k in ("engine", "vLLM"))
        cos = (ours * peer).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(peer, axis=1)
        print(f"cosine to vLLM's embeddings: min {cos.min():.6f}")
        best = {k: 0.0 for k in sides}
        for _ in range(a.repeats):
            for name, w in sides.items():
                best[name] = max(best[name], a.texts / w.ask("embed")["seconds"])
    finally:
        for w in sides.values():
            w.close()
    for name, rate in best.items():
        print(f"{name + ' (own process)':>22}: {rate:8.1f} texts/s")
    targets.record(f"{a.texts} short texts/s vs vLLM pooling", best["engine"] / best["vLLM"],
                   TARGET_VS_PEER)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--texts", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--peer", choices=["vllm"])
    p.add_argument("--threads", default="0-1", help="CPUs both sides of --peer run on")
    p.add_argument("--child")
    p.add_argument("--model")
    add_check_argument(p)
    a = p.parse_args()
    if a.child:
        child(a.child, a.model, a.texts)
        return 0

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from engine import LLM
    from engine.tiny_pooling_model import make_tiny_pooling_model

    with tempfile.TemporaryDirectory() as d:
        path = make_tiny_pooling_model(Path(d) / "minilm", arch="bert", sizes=MINILM,
                                       init_std=0.05)
        batch = texts(a.texts)
        ours = LLM(path, dtype="float32", bind_threads=False)
        st = SentenceTransformer(str(path), device="cpu")
        got = np.array([o.outputs.embedding for o in ours.embed(batch[:64])])
        want = st.encode(batch[:64])
        cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        print(f"{torch.get_num_threads()} torch threads; cosine to sentence-transformers "
              f"min {cos.min():.6f}")
        best = {"engine": 0.0, "sentence-transformers": 0.0}
        sides = {"engine": lambda: ours.embed(batch),
                 "sentence-transformers": lambda: st.encode(batch, batch_size=32)}
        for _ in range(a.repeats):
            for name, run in sides.items():
                t0 = time.perf_counter()
                run()
                best[name] = max(best[name], len(batch) / (time.perf_counter() - t0))
        for name, rate in best.items():
            print(f"{name:>22}: {rate:8.1f} texts/s")
        targets = Targets()
        targets.record("cosine to sentence-transformers (min)", float(cos.min()), 0.9999,
                       unit="")
        targets.record(f"{a.texts} short texts/s vs sentence-transformers",
                       best["engine"] / best["sentence-transformers"], TARGET_VS_ST)
        if a.peer:
            del ours, st  # the sides in their own processes have the CPUs to themselves
            versus_peer(a, path, targets)
    return targets.finish(a.check, "embed" if a.record else None)


if __name__ == "__main__":
    sys.exit(main())
