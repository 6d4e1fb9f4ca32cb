"""Chat templates rendered under limits: time, output size, and the size of what one expression builds.

A model directory is untrusted input, and so are the messages a template loops over. jinja2's
sandbox (as transformers uses) stops attribute tricks and caps `range()` at 100,000 items, but not
`range(99999)` nested three deep (10^15 iterations), `'x' * 10**10`, `'x'|center(10**10)`, or a
string doubled in a loop: any of them froze a server or took gigabytes. Here:

- time: the render runs under a trace function (`sys.settrace`, for this thread only) that raises
  `ChatTemplateError` once `time_limit_s` has passed: every line of the compiled template, and
  every Python call it makes, is a point where a runaway render stops;
- output: rendered through `generate()`, stopped once it passes `max_chars`;
- one expression: `*` and `**` are intercepted and refused when their result would pass
  `max_chars` (or `MAX_EXPONENT_BITS`); any call or filter given an integer larger than
  `max_chars` (a width, a count) is refused; and the process's resident memory is read every
  10 ms of rendering, refusing a render that grew it by more than `max_memory_bytes`.

Callers run renders off the event loop (tandem.serve.openai_api), so a template that runs to its
limit delays only its own request.
"""

from __future__ import annotations

import operator
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatTemplateError", "LimitedEnvironment", "TemplateLimits", "render_limited"]

MAX_EXPONENT_BITS = 4096  # 2**4096 is far past any number a chat template prints


class ChatTemplateError(ValueError):
    """The chat template refused the messages (e.g. raise_exception), is missing, or ran past a limit."""


@dataclass(frozen=True)
class TemplateLimits:
    time_limit_s: float = 1.0
    max_chars: int = 4 << 20  # the rendered prompt, and anything one expression builds
    max_memory_bytes: int = 256 << 20  # growth of the process's resident memory during one render


def _length(value: Any) -> int | None:
    try:
        return len(value)
    except TypeError:
        return None


class LimitedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, refusing expressions whose result would be larger than `max_chars`."""

    intercepted_binops = frozenset(["*", "**"])

    def __init__(self, max_chars: int, **options: Any) -> None:
        super().__init__(**options)
        self.max_chars = max_chars
        self.filters = {name: self._guarded(name, f) for name, f in self.filters.items()}

    def _refuse_big_ints(self, what: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        for value in (*args, *kwargs.values()):
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > self.max_chars:
                raise ChatTemplateError(f"chat template: {what} was given {value}, over the limit of {self.max_chars}")

    def _guarded(self, name: str, func: Callable[..., Any]) -> Callable[..., Any]:
        def guarded(*args: Any, **kwargs: Any) -> Any:
            self._refuse_big_ints(f"the filter '{name}'", args, kwargs)
            return func(*args, **kwargs)

        for attr in ("jinja_pass_arg",):  # keep how jinja passes the context/environment to the filter
            if hasattr(func, attr):
                setattr(guarded, attr, getattr(func, attr))
        return guarded

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja's signature)
        __self._refuse_big_ints(f"{getattr(__obj, '__name__', 'a call')}()", args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context: Any, operator_name: str, left: Any, right: Any) -> Any:
        if operator_name == "*":
            for seq, times in ((left, right), (right, left)):
                size = _length(seq)
                if size is not None and isinstance(times, int) and size * times > self.max_chars:
                    raise ChatTemplateError(f"chat template: a repetition would build {size * times} items")
            return operator.mul(left, right)
        if isinstance(left, int) and isinstance(right, int) and right > 0:
            if abs(left) > 1 and right * max(abs(left).bit_length(), 1) > MAX_EXPONENT_BITS:
                raise ChatTemplateError(f"chat template: {left} ** {right} is too large")
        return operator.pow(left, right)


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class _Watch:
    """The trace function: stops the render once its time or memory is spent."""

    MEMORY_EVERY_S = 0.01  # how often resident memory is read (a line of /proc/self/statm)

    def __init__(self, limits: TemplateLimits) -> None:
        self.limits = limits
        now = time.monotonic()
        self.deadline = now + limits.time_limit_s
        self.next_memory_check = now + self.MEMORY_EVERY_S
        self.memory_at_start = _resident_bytes()

    def check(self) -> None:
        now = time.monotonic()
        if now > self.deadline:
            raise ChatTemplateError(f"chat template: rendering took longer than {self.limits.time_limit_s:g} s")
        if now >= self.next_memory_check and self.memory_at_start:
            self.next_memory_check = now + self.MEMORY_EVERY_S
            if _resident_bytes() - self.memory_at_start > self.limits.max_memory_bytes:
                megabytes = self.limits.max_memory_bytes >> 20
                raise ChatTemplateError(f"chat template: rendering took more than {megabytes} MB")

    def __call__(self, frame: Any, event: str, arg: Any) -> Callable[..., Any]:
        self.check()
        return self.local

    def local(self, frame: Any, event: str, arg: Any) -> Callable[..., Any]:
        if event == "line":
            self.check()
        return self.local


def render_limited(template: Any, context: Mapping[str, Any], limits: TemplateLimits) -> str:
    """`template.generate(**context)` joined, within `limits` (ChatTemplateError past any of them)."""
    watch = _Watch(limits)
    previous = sys.gettrace()
    parts: list[str] = []
    size = 0
    sys.settrace(watch)
    try:
        for part in template.generate(**context):
            size += len(part)
            if size > limits.max_chars:
                raise ChatTemplateError(f"chat template: the rendered prompt passed {limits.max_chars} characters")
            parts.append(part)
    finally:
        sys.settrace(previous)
    return "".join(parts)
