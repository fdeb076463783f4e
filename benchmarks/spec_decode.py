"""N-gram speculative decoding: one request's decode tokens/s with
`{"method": "ngram", ...}` against the same model without it, in the same
run; the greedy ids must be identical (exit 1 otherwise). Target
(--check): >= 1.5x (issue 41).

The task is a repetitive one, as editing or summarizing a given text is: the
prompt holds a text and the output repeats it. No real checkpoint reaches
this machine, so the model is a random one made to repeat: benchmarks/
models.py's "medium" Llama (8 layers, 1024 hidden, 8192 vocab: 117M
parameters, 470 MB in float32, so the forward dominates a step), its layers'
outputs (o_proj, down_proj) scaled by --damp and its lm_head set so that the
next token is mostly a fixed successor of the current one (a random
permutation of the vocabulary, one long cycle). The text is 256 tokens of
that succession with every EDIT_EVERY-th token replaced by another, the
prompt the text and then its first token again: the output repeats the
text but for those tokens, as a real model's edit follows its source but
where it edits (there the drafts are rejected, and the next step has none).
Attention and the MLPs are computed as in any model (at --damp 0.3 they
turn the output away from the text).

Both engines stay loaded and run in turns (--rounds), each timed at its
best round: the machine is shared, and a neighbour's burst should not fall
on one engine only.

    python benchmarks/spec_decode.py [--tokens 96] [--k 4] [--rounds 3] [--draft-layers N] [--check]

With --draft-layers N the drafts come from a draft model instead (upstream's
draft_model method): the same checkpoint cut to its first N layers, which
reads the same residual stream and so proposes what the whole model would.
"""
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))  # benchmarks/bisect.py would shadow bisect
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from benchmarks.common import Targets, add_check_argument  # noqa: E402
from benchmarks.models import make_model  # noqa: E402

TARGET = 1.5
SIZE = "medium"
TEXT_TOKENS = 256
LOGIT_GAP = 10.0  # the successor's logit over the rest's typical spread
EDIT_EVERY = 12  # the output differs from the prompt's text at one token in this many


def make_repeating(folder: Path, damp: float) -> list[int]:
    """Turn the checkpoint into one that mostly repeats a succession of
    tokens; the successor of each token id (a list)."""
    import torch
    from safetensors.torch import load_file, save_file

    (path,) = folder.glob("*.safetensors")
    t = load_file(str(path))
    for name in t:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            t[name] = t[name] * damp
    emb = t["model.embed_tokens.weight"]
    order = torch.randperm(emb.shape[0], generator=torch.Generator().manual_seed(0))
    successor = torch.empty_like(order)
    successor[order] = order.roll(-1)
    # the residual stream is mostly the token's embedding: its successor's
    # lm_head row is that embedding's direction, scaled to LOGIT_GAP
    head = torch.empty_like(emb)
    head[successor] = emb / emb.norm(dim=1, keepdim=True) * LOGIT_GAP / emb.shape[1] ** 0.5
    t["lm_head.weight"] = head.contiguous()
    save_file(t, str(path), metadata={"format": "pt"})
    return successor.tolist()


def make_draft(model: Path, folder: Path, layers: int) -> Path:
    """The checkpoint's first `layers` layers (its embeddings, norm and lm_head):
    a draft that reads the same residual stream, several times cheaper."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    folder.mkdir()
    for f in model.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, folder / f.name)
    config = json.loads((model / "config.json").read_text())
    config["num_hidden_layers"] = layers
    (folder / "config.json").write_text(json.dumps(config))
    (path,) = model.glob("*.safetensors")
    kept = {k: v for k, v in load_file(str(path)).items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    save_file(kept, str(folder / path.name), metadata={"format": "pt"})
    return folder


def timed(engine, prompt: list[int], tokens: int) -> tuple[list[int], float]:
    from engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True)
    t0 = time.perf_counter()
    out = engine.generate([prompt], params)[0].outputs[0].token_ids
    return out, time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_check_argument(p)
    p.add_argument("--tokens", type=int, default=96, help="output tokens (default 96)")
    p.add_argument("--k", type=int, default=4, help="num_speculative_tokens (default 4)")
    p.add_argument("--lookup-max", type=int, default=3, help="prompt_lookup_max (default 3)")
    p.add_argument("--damp", type=float, default=0.05,
                   help="scale of the layers' outputs (default 0.05)")
    p.add_argument("--rounds", type=int, default=3, help="timed turns per engine (default 3)")
    p.add_argument("--draft-layers", type=int, default=0,
                   help="draft_model instead of ngram: a draft of the model's first N layers")
    args = p.parse_args(argv)
    from engine.entrypoints.llm import LLM
    from engine.sampling_params import SamplingParams

    spec = {"method": "ngram", "num_speculative_tokens": args.k,
            "prompt_lookup_max": args.lookup_max, "prompt_lookup_min": 1}
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(Path(tmp) / SIZE, SIZE)
        successor = make_repeating(model, args.damp)
        text = [5]
        while len(text) < TEXT_TOKENS:
            text.append(successor[text[-1]])
        source = [successor[successor[t]] if i % EDIT_EVERY == EDIT_EVERY - 1 else t
                  for i, t in enumerate(text)]  # what the output edits
        prompt = [1] + source + [1, text[0]]  # the text, then its beginning again
        if args.draft_layers:
            draft = make_draft(model, Path(tmp) / "draft", args.draft_layers)
            spec = {"model": str(draft), "num_speculative_tokens": args.k}
        kw = dict(dtype="float32", max_model_len=1024, block_size=128, num_kv_blocks=16)
        engines = {"without": LLM(model, **kw), "with": LLM(model, speculative_config=spec, **kw)}
    method = (f"a {args.draft_layers}-layer draft model" if args.draft_layers else "ngram")
    warm = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    best: dict[str, float] = {}
    ids: dict[str, list[int]] = {}
    for r in range(args.rounds):
        for name, engine in engines.items():
            engine.generate([prompt[:8]], warm)
            ids[name], s = timed(engine, prompt, args.tokens)
            best[name] = min(best.get(name, s), s)
            print(f"round {r + 1}: {name} {method}: {args.tokens / s:.1f} tok/s", flush=True)
    if ids["with"] != ids["without"]:
        first = next(i for i, (a, b) in enumerate(zip(ids["with"], ids["without"])) if a != b)
        raise SystemExit(f"greedy ids differ with speculation, from output token {first}")
    stats = engines["with"].core.scheduler.spec_stats
    follows = sum(a == b for a, b in zip(ids["without"], source[1:]))
    ratio = best["without"] / best["with"]
    print(f"{SIZE} model (117M parameters, float32), {len(prompt)}-token prompt, "
          f"{args.tokens} tokens, {follows} of them repeating the text: best "
          f"{args.tokens / best['without']:.1f} tok/s without, "
          f"{args.tokens / best['with']:.1f} tok/s with {method} k={args.k}: {ratio:.2f}x; "
          "greedy ids identical")
    print(f"drafts {stats.num_drafts}, draft tokens {stats.num_draft_tokens}, accepted "
          f"{stats.num_accepted_tokens}, by position {stats.num_accepted_tokens_per_pos}")
    targets = Targets()
    what = f"draft model ({args.draft_layers} layers)" if args.draft_layers else "ngram"
    targets.record(f"one request's decode tok/s, {what} vs none", ratio, TARGET)
    return targets.finish(args.check, record_as="spec_decode" if args.record else None)


if __name__ == "__main__":
    sys.exit(main())
