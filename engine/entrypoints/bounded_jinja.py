"""A Jinja sandbox whose renders end: within a deadline, and within a size
(of the output, and of any one string or list the template builds).

A chat template comes with the model's files, and one with a loop that never
ends, or a string that doubles on every turn, would hold a server thread (and
its memory) for good. A thread cannot be stopped from outside, so the template
checks on itself: the sandbox's hooks (every call, attribute, subscript,
filter, test and the growing operators) and every item of every `for` loop
look at the render's deadline, and what can grow a string or list checks its
size. The limits are per render (a context variable), so renders in a thread
pool each keep their own."""
from __future__ import annotations

import contextvars
import functools
import time
from typing import Any

from jinja2 import nodes
from jinja2.runtime import markup_join, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import pass_eval_context
from jinja2.visitor import NodeTransformer

# `**` past this many bits is refused before Python starts on it: a power is one C
# call that no deadline interrupts (9 ** 9 ** 9 would run for hours); no template
# needs a number anywhere near it
MAX_POW_BITS = 1 << 16

_SIZE_FILTER = "_bounded_size"  # checks what a {% set %}...{% endset %} block captured


class RenderLimitError(Exception):
    """The render went past its deadline or size limit (what the template did, in words)."""


class _Stop(BaseException):
    # BaseException: Jinja's own `except Exception` (which rewrites tracebacks) and a
    # filter's error handling let it through, so it reaches render() as raised
    pass


class _Budget:
    __slots__ = ("deadline", "timeout_s", "max_chars")

    def __init__(self, timeout_s: float, max_chars: int):
        self.deadline = time.monotonic() + timeout_s
        self.timeout_s, self.max_chars = timeout_s, max_chars


# None outside render(): compile-time constant folding and direct uses run unchecked
_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "bounded_jinja_budget", default=None)


def _tick() -> None:
    budget = _BUDGET.get()
    if budget is not None and time.monotonic() > budget.deadline:
        raise _Stop(f"took longer than {budget.timeout_s} s (its loops never end?)")


def _sized(value: Any) -> Any:
    budget = _BUDGET.get()
    if (budget is not None and isinstance(value, (str, list, tuple))
            and len(value) > budget.max_chars):
        raise _Stop(f"built a string or list of {len(value)} items, more than "
                    f"{budget.max_chars} (one that grows on every turn of a loop?)")
    return value


def _check_repeat(left: Any, right: Any) -> None:
    """`s * n` is refused before it allocates a string past the limit."""
    budget = _BUDGET.get()
    if budget is None:
        return
    for seq, n in ((left, right), (right, left)):
        if (isinstance(seq, (str, list, tuple)) and isinstance(n, int)
                and len(seq) * n > budget.max_chars):
            raise _Stop(f"repeats a string or list {n} times, past {budget.max_chars} items")


def _check_power(base: Any, exp: Any) -> None:
    if (_BUDGET.get() is not None and isinstance(base, int) and isinstance(exp, int)
            and exp > 0 and exp * (abs(base).bit_length() - 1) > MAX_POW_BITS):
        raise _Stop(f"computes a power of more than {MAX_POW_BITS} bits")


def _checked(func):
    @functools.wraps(func)  # keeps jinja_pass_arg (pass_context, ...) with the rest
    def checked(*args, **kwargs):
        _tick()
        return _sized(func(*args, **kwargs))

    checked.bounded_jinja = True
    return checked


def _size_filter(value: str) -> str:
    return _sized(value)


class _RouteChecks(NodeTransformer):
    """Sends through the environment what the sandbox's hooks never see: the items
    of `for` loops (over range() or anything else), `~` and block `set`s (which
    build strings without calling anything)."""

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        node.iter = _env_call("bounded_iter", [node.iter], node.iter)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Call:
        self.generic_visit(node)
        return _env_call("bounded_concat", node.nodes, node)

    def visit_AssignBlock(self, node: nodes.AssignBlock) -> nodes.AssignBlock:
        self.generic_visit(node)
        # applied after the block's own filters, if it has any ({% set x | upper %})
        node.filter = nodes.Filter(node.filter, _SIZE_FILTER, [], [], None, None,
                                   lineno=node.lineno)
        return node


def _env_call(name: str, args: list, at: nodes.Node) -> nodes.Call:
    return nodes.Call(nodes.EnvironmentAttribute(name), list(args), [], None, None,
                      lineno=at.lineno)


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment (as transformers renders chat templates with)
    whose templates check the limits render() sets; otherwise they render the same."""

    # the operators that grow a value past any bound in a few steps (+ and % double
    # a string, * and ** more); the rest stay plain Python operators
    intercepted_binops = frozenset({"+", "%", "*", "**"})

    def from_string(self, source, globals=None, template_class=None):
        ast = self.parse(source) if isinstance(source, str) else source
        ast = _RouteChecks().visit(ast)
        ast.set_environment(self)
        # filters and tests are wrapped here, not at construction, so that the ones a
        # caller adds after (tojson, ...) are checked too
        self.filters[_SIZE_FILTER] = _size_filter
        for table in (self.filters, self.tests):
            for name, func in table.items():
                if not getattr(func, "bounded_jinja", False):
                    table[name] = _checked(func)
        return super().from_string(ast, globals, template_class)

    def call(self, context, obj, /, *args, **kwargs):
        _tick()
        return _sized(super().call(context, obj, *args, **kwargs))

    def getattr(self, obj, attribute):
        _tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        _tick()
        return super().getitem(obj, argument)

    def call_binop(self, context, operator, left, right):
        _tick()
        if operator == "*":
            _check_repeat(left, right)
        elif operator == "**":
            _check_power(left, right)
        return _sized(super().call_binop(context, operator, left, right))

    # (bounded_: Environment has a `concat` of its own, which every template joins with)
    def bounded_iter(self, iterable):
        for item in iterable:
            _tick()
            yield item

    @pass_eval_context
    def bounded_concat(self, eval_ctx, *parts):
        # as Jinja's own code for `~` picks its join
        join = markup_join if eval_ctx.volatile or eval_ctx.autoescape else str_join
        return _sized(join(parts))


def render(template, variables: dict, *, timeout_s: float, max_chars: int) -> str:
    """template (from a BoundedEnvironment) rendered with variables, or
    RenderLimitError when it takes longer than timeout_s, writes more than
    max_chars characters, builds a value past them, or recurses without end."""
    token = _BUDGET.set(_Budget(timeout_s, max_chars))
    chunks = template.generate(**variables)
    out, size = [], 0
    try:
        for chunk in chunks:
            size += len(chunk)
            if size > max_chars:
                raise _Stop(f"wrote more than {max_chars} characters (its loops never end?)")
            _tick()
            out.append(chunk)
    except _Stop as stop:
        raise RenderLimitError(str(stop)) from None
    except RecursionError:
        raise RenderLimitError("recursed too deeply (a macro that calls itself without "
                               "end?)") from None
    finally:
        chunks.close()
        _BUDGET.reset(token)
    return "".join(out)
