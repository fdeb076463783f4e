"""What a pooling request asks for (upstream vLLM's PoolingParams): its task,
and how its pooled vector is finished. A bad value is a ValueError naming
the field (the server turns it into a 400)."""
from __future__ import annotations

from dataclasses import dataclass

from engine.sampling_params import SamplingParams

#: what a pooling model is run for: embed (/v1/embeddings, /pooling), classify
#: (/classify), score (/score, /rerank: a cross-encoder's one logit per pair)
TASKS = ("embed", "classify", "score")


@dataclass
class PoolingParams:
    task: str = "embed"
    dimensions: int | None = None  # embed: keep the first N (Matryoshka), then normalize
    normalize: bool | None = None  # embed: None is the model's own (normalized by default)
    use_activation: bool | None = None  # classify/score: softmax/sigmoid (None: yes)

    def check(self, hidden_size: int, matryoshka: list[int] | None = None) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        d = self.dimensions
        if d is None:
            return
        if self.task != "embed":
            raise ValueError("dimensions: only embeddings can be shortened; leave it unset")
        if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d <= hidden_size:
            raise ValueError(f"dimensions must be an integer in [1, {hidden_size}] (the "
                             f"model's embedding size), got {d!r}")
        if matryoshka and d not in matryoshka:
            raise ValueError(f"dimensions: the model was trained for "
                             f"{', '.join(map(str, matryoshka))}; got {d}")


#: what a pooling request holds where a generating one has its sampling: never
#: read (a pooling engine neither samples nor stops), but the request types stay one
NO_SAMPLING = SamplingParams(max_tokens=1)
