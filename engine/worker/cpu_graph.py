"""A step's ops recorded once and replayed (the CPU's counterpart of the CUDA
graphs upstream captures for decode): every op the step dispatches is
recorded with its arguments, then replayed on the same tensors, so a replay
costs the kernels and one dispatcher call each, from C++ (csrc/step_graph.cpp)
where the build has it. The Python around them (module calls, views, argument
parsing) is what a deep narrow model's decode step spent as much as its weights on.

What replays: allocations and views are skipped (their tensors are kept);
ops that write their arguments run again as they ran; an op that returns new
tensors runs as its out= overload into the tensors it returned at capture
(or, lacking one, runs and is copied there). A step that reads a tensor's
value back into Python (.item(), .tolist(), nonzero) decided something the
replay could not redo: it is not captured."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
_ALLOCATIONS = {aten.empty.memory_format, aten.empty_like.default, aten.new_empty.default,
                aten.empty_strided.default, aten.new_empty_strided.default}
# ops whose result Python reads back: the step's control flow may depend on it
_READ_BACK = {aten._local_scalar_dense.default, aten.item.default, aten.allclose.default,
              aten.nonzero.default, aten.equal.default,
              aten.is_nonzero.default, aten.masked_select.default, aten.unique_dim.default,
              aten._unique2.default}


class NotCapturable(Exception):
    """A step whose ops cannot be replayed; the message says why."""


class _Recorder(TorchDispatchMode):
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # torch wraps a mode's __torch_dispatch__ in _disable_dynamo unless the
        # mode says no, and the wrapper's first call imports torch._dynamo (and
        # sympy): 3.6 s alone on a 2-core Zen 4, inside the first capture, which
        # can fall mid-request. Nothing here is ever compiled: nothing to disable
        return False

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []
        self.refused: str | None = None

    def __torch_dispatch__(self, func, types, args: tuple = (), kwargs: dict | None = None
                           ) -> Any:
        kwargs = kwargs or {}
        if func in _READ_BACK and self.refused is None:
            self.refused = f"the step reads a value back ({func})"
        out = func(*args, **kwargs)
        self.calls.append((func, args, kwargs, out))
        return out


def _full_args(schema, args, kwargs) -> list:
    """Every argument of `schema` in order, defaults filled in (a boxed call's stack)."""
    values = []
    for i, a in enumerate(schema.arguments):
        if not a.kwarg_only and i < len(args):
            values.append(args[i])
        elif a.name in kwargs:
            values.append(kwargs[a.name])
        elif a.has_default_value():
            values.append(a.default_value)
        else:
            raise NotCapturable(f"{schema.name}: no value for its argument {a.name}")
    return values


def _writes(schema) -> bool:
    return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _is_setting(args, out) -> bool:
    """A query of the build's settings (_C.cpu_has_*): no tensor in or out."""
    return (not any(isinstance(a, torch.Tensor) for a in args)
            and not isinstance(out, (torch.Tensor, tuple, list)))


def _may_alias(func) -> bool:
    """A view, or an op that returns its input where it can (contiguous, reshape,
    to): its result is a view at capture or a copy that each replay must redo."""
    return func.is_view or any(r.alias_info is not None for r in func._schema.returns)


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _copies(args, outs: list[torch.Tensor]) -> bool:
    """Whether a may-alias op copied: its results share no input's memory."""
    inputs = {_storage(a) for a in args if isinstance(a, torch.Tensor)}
    return not any(_storage(o) in inputs for o in outs)


def _out_overload(func):
    """func's out= overload: the same arguments (names and types: __rshift__.Tensor's
    is Tensor_out, though Scalar_out's names are the same), then one written
    kwarg-only argument per result; None where it has none."""
    sig = [(a.name, str(a.type)) for a in func._schema.arguments]
    results = len(func._schema.returns)
    for name in func.overloadpacket.overloads():
        other = getattr(func.overloadpacket, name)
        args = other._schema.arguments
        extra = args[len(sig):]
        if ([(a.name, str(a.type)) for a in args[:len(sig)]] == sig and len(extra) == results
                and all(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
                        for a in extra)):
            return other
    return None


def _tensors(out, func=None) -> list[torch.Tensor]:
    items = list(out) if isinstance(out, (tuple, list)) else [out]
    if not all(isinstance(t, torch.Tensor) for t in items):
        raise NotCapturable(f"{func} returned {type(out).__name__}, not tensors")
    return items


class _Call:
    """An op run again on its recorded arguments (`args`: the schema's, all of them)."""

    def __init__(self, func, args: list):
        self.func, self.args = func, args
        kw = [a.kwarg_only for a in func._schema.arguments]
        self._args = [v for v, k in zip(args, kw) if not k]
        self._kwargs = {a.name: v for a, v in zip(func._schema.arguments, args) if a.kwarg_only}

    def __call__(self) -> None:
        self.func(*self._args, **self._kwargs)


@dataclass
class _CopyBack:
    """An op with no out= overload: run it, and copy its results where they were."""
    func: Callable[..., Any]
    args: tuple
    kwargs: dict
    outs: list[torch.Tensor]

    def __call__(self) -> None:
        for dst, src in zip(self.outs, _tensors(self.func(*self.args, **self.kwargs))):
            dst.copy_(src)


def _plan(calls: list[tuple]) -> list:
    """The recorded calls as replay steps (_Call and _CopyBack)."""
    steps: list = []
    for func, args, kwargs, out in calls:
        schema = func._schema
        if func in _ALLOCATIONS or _is_setting(args, out):
            continue
        if _may_alias(func) and not _writes(schema):
            outs = _tensors(out, func)
            if not _copies(args, outs):
                continue  # a view: it sees whatever its base holds
            first = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if len(outs) == 1 and first is not None and first.shape == outs[0].shape:
                steps.append(_Call(aten.copy_.default, [outs[0], first, False]))
            else:
                steps.append(_CopyBack(func, args, kwargs, outs))
            continue
        if _writes(schema) or not schema.returns:
            steps.append(_Call(func, _full_args(schema, args, kwargs)))
            continue
        outs = _tensors(out, func)
        overload = _out_overload(func)
        if overload is None:
            steps.append(_CopyBack(func, args, kwargs, outs))
        else:
            steps.append(_Call(overload, _full_args(schema, args, kwargs) + outs))
    return steps


def _native_graph():
    """An empty C++ StepGraph, or None where this build has none (the `empty` variant)."""
    try:
        return torch.classes._C.StepGraph()
    except (RuntimeError, AttributeError):
        return None


def _segments(steps: list) -> list[Callable[[], None]]:
    """Runs of steps the C++ graph takes (one call each run), and the rest as they are."""
    out: list[Callable[[], None]] = []
    graph = None
    for step in steps:
        if isinstance(step, _Call):
            if graph is None:
                graph = _native_graph()
            if graph is not None:
                schema = step.func._schema
                try:
                    graph.add(schema.name, schema.overload_name, step.args)
                    continue
                except RuntimeError:  # an argument C++ cannot take as the schema wants
                    pass
        if graph is not None and graph.size():
            out.append(_runner(graph))
            graph = None
        out.append(step)
    if graph is not None and graph.size():
        out.append(_runner(graph))
    return out


def _runner(graph) -> Callable[[], None]:
    run = torch.ops._C.step_graph_run.default
    return lambda: run(graph)


class CapturedStep:
    """The replay of a captured step: its result tensors are rewritten each time."""

    def __init__(self, segments: list[Callable[[], None]], result: torch.Tensor,
                 native_calls: int, python_calls: int):
        self.segments, self.result = segments, result
        self.native_calls, self.python_calls = native_calls, python_calls

    def replay(self) -> torch.Tensor:
        for segment in self.segments:
            segment()
        return self.result


def capture(step: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, CapturedStep | str]:
    """Run `step` once, recording its ops: (its result, the replay), or (its
    result, why a replay could not redo it)."""
    recorder = _Recorder()
    with recorder:
        result = step()
    try:
        if recorder.refused is not None:
            raise NotCapturable(recorder.refused)
        if not isinstance(result, torch.Tensor):
            raise NotCapturable(f"the step returned {type(result).__name__}, not a tensor")
        steps = _plan(recorder.calls)
    except NotCapturable as e:
        return result, str(e)
    segments = _segments(steps)
    python = sum(1 for s in segments if isinstance(s, (_Call, _CopyBack)))
    return result, CapturedStep(segments, result, len(steps) - python, python)
