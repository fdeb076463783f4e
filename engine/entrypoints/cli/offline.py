"""`engine generate` and `engine bench`: the model in this process (LLM)."""
from __future__ import annotations

import time

from engine.entrypoints.cli.args import common_args


def add_parsers(sub) -> None:
    """`engine generate` and `engine bench`."""
    g = sub.add_parser("generate", help="generate text for prompts")
    common_args(g)
    g.add_argument("--prompt", action="append", required=True, help="repeat for a batch")
    g.add_argument("--max-tokens", type=int, default=64)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=-1)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--stop", action="append")
    g.add_argument("--ignore-eos", action="store_true")
    b = sub.add_parser("bench", help="throughput on synthetic prompts")
    common_args(b)
    b.add_argument("--num-prompts", type=int, default=16)
    b.add_argument("--input-len", type=int, default=32)
    b.add_argument("--output-len", type=int, default=128)


def _llm(args):
    from engine.engine_args import cli_engine_args
    from engine.entrypoints.llm import LLM

    return LLM(model=args.model, dtype=args.dtype, **cli_engine_args(args))


def generate(args) -> int:
    from engine.sampling_params import SamplingParams

    llm = _llm(args)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
                            seed=args.seed, max_tokens=args.max_tokens, stop=args.stop or None,
                            ignore_eos=args.ignore_eos)
    for out in llm.generate(args.prompt, params):
        print(out.outputs[0].text)
    return 0


def bench(args) -> int:
    """Throughput on synthetic prompts: tokens generated per second."""
    import torch

    from engine.sampling_params import SamplingParams

    llm = _llm(args)
    g = torch.Generator().manual_seed(0)
    vocab = llm.core.config.vocab_size
    prompts = [torch.randint(3, vocab, (args.input_len,), generator=g).tolist()
               for _ in range(args.num_prompts)]
    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=2))  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    dt = time.perf_counter() - t0
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    print(f"{args.num_prompts} requests x {args.output_len} tokens: {n} tokens in {dt:.2f} s = "
          f"{n / dt:.1f} tokens/s")
    return 0
