"""Embeddings of many short texts (the usual retrieval load): this engine's
LLM.embed against sentence-transformers' encode() on the same random
MiniLM-L6-shaped BERT (384 hidden, 6 layers, mean pooling, normalized),
the same 1000 texts, the same torch and threads, in this one process, the
two taking turns (this machine's speed drifts over minutes); the fastest
round of each counts. The two answers are checked equal (cosine) first.

    python benchmarks/embed.py [--texts 1000] [--repeats 3] [--check] [--record]

Target: texts/s >= 2x sentence-transformers' (its default batch of 32).
--check exits 1 on a missed target."""
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

from benchmarks.common import Targets, add_check_argument

TARGET_VS_ST = 2.0
# all-MiniLM-L6-v2's shape, the most used small embedding model
MINILM = dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=6,
              num_attention_heads=12, max_position_embeddings=512)


def texts(n: int, seed: int = 0) -> list[str]:
    """n texts of 4 to 24 words: queries and short passages."""
    from engine.tiny_model import CORPUS

    words = " ".join(CORPUS).split()
    rng = random.Random(seed)
    return [" ".join(rng.choices(words, k=rng.randint(4, 24))) for _ in range(n)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--texts", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=2)
    add_check_argument(p)
    a = p.parse_args()

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
    targets.record("cosine to sentence-transformers (min)", float(cos.min()), 0.9999, unit="")
    targets.record(f"{a.texts} short texts/s vs sentence-transformers",
                   best["engine"] / best["sentence-transformers"], TARGET_VS_ST)
    return targets.finish(a.check, "embed" if a.record else None)


if __name__ == "__main__":
    sys.exit(main())
