"""The engine's greedy output against transformers' generate() on one device,
token for token, in float32, on small random Llama and Qwen3 checkpoints."""
from __future__ import annotations

import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
PROMPTS = ["the a of to and in is it you that he was", "water",
           "look more day could go come did number sound no most"]
TOKENS = 16


def _hf_greedy(path: Path, prompt_ids: list[int], device: str) -> list[int]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    # transformers declares PreTrainedModel.to through functools.wraps(nn.Module.to),
    # which mypy does not bind: `device` is taken for `self`
    model = model.to(device).eval()  # type: ignore[arg-type]
    ids = torch.tensor([prompt_ids], device=device)
    out = model.generate(ids, max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False,
                         eos_token_id=None, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


def run(device: str, workdir: Path, log=print) -> list[str]:
    """Failures (empty: the engine and transformers agree on every prompt)."""
    sys.path.insert(0, str(REPO / "tests"))
    from helpers import make_checkpoint  # a random checkpoint, built locally: no download

    from engine import LLM, SamplingParams
    from engine.platforms import current

    runs_on = current().device().type
    if runs_on != torch.device(device).type:
        return [f"greedy: this build of the engine runs on {runs_on}, not {device} "
                f"(variant {current().name}); build the variant for {device}"]
    failures = []
    for i, model_type in enumerate(("llama", "qwen3")):
        path = make_checkpoint(workdir / model_type, model_type, seed=i)
        llm = LLM(model=path, dtype="float32", block_size=32, num_kv_blocks=64,
                  bind_threads=False)
        outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=TOKENS,
                                                    ignore_eos=True))
        for o in outs:
            want = _hf_greedy(path, o.prompt_token_ids, device)
            got = o.outputs[0].token_ids
            name = f"greedy {model_type} [{device}] {o.prompt!r}"
            if got != want:
                failures.append(f"{name}: engine {got} != transformers {want}")
                log(f"FAIL {failures[-1]}")
            else:
                log(f"ok   {name}")
        del llm
    return failures
