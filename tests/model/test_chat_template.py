"""Chat templates render under limits: loops, huge repetitions and runaway growth are refused fast
with ChatTemplateError (a 400 for the request), each by the limit meant for it (so memory stays
bounded: nothing big is built before a limit refuses it), and ordinary templates render as before."""

from __future__ import annotations

import re
import time
from dataclasses import replace

import pytest
from timing import within

from tandem.model.chat_template import ChatTemplateError, LimitedEnvironment, TemplateLimits, render_limited

LIMITS = TemplateLimits(time_limit_s=0.5, max_chars=1 << 20, max_memory_bytes=64 << 20)
MESSAGES = [{"role": "user", "content": "hi"}]

# Each bomb, and the limit that stops it.
BOMBS = {
    "nested loops (10^15 iterations)": (
        "{% for a in range(99999) %}{% for b in range(99999) %}{% for c in range(99999) %}"
        "{% endfor %}{% endfor %}{% endfor %}",
        "took longer than 0.5 s",
    ),
    "a repetition of 10^10": ("{{ 'x' * 10000000000 }}", "a repetition would build"),
    "a repetition, reversed": ("{{ 100000000 * [1] }}", "a repetition would build"),
    "a filter given a huge width": ("{{ 'x'|center(10000000000) }}", "the filter 'center' was given"),
    "a method given a huge width": ("{{ 'x'.ljust(10000000000) }}", "ljust() was given"),
    "a string doubled in a loop": (
        "{% set ns = namespace(s='xxxxxxxx') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
        "{{ ns.s|length }}",
        "took more than 64 MB",
    ),
    "a tower of powers": ("{{ 2 ** 100000000 }}", "is too large"),
    "output past the limit": ("{% for i in range(100000) %}{{ 'y' * 100 }}{% endfor %}", "passed 1048576 characters"),
    "a range past jinja's cap": ("{{ range(10000000000)|list|length }}", "range() was given"),
    "endless recursion": ("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "RecursionError"),
    "a type error on the messages": ("{{ messages[0]['content'] + 1 }}", "TypeError"),
}


@pytest.fixture(scope="module")
def tokenizer(tiny_llama_dir):
    from tandem.model import Tokenizer

    return Tokenizer(tiny_llama_dir, LIMITS)


def render(source: str) -> str:
    return render_limited(LimitedEnvironment(LIMITS.max_chars).from_string(source), {"messages": MESSAGES}, LIMITS)


def test_ordinary_templates_render(tokenizer):
    source = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}{{ '-' * 3 }}{{ 2 ** 10 }}"
    assert render(source) == "<|user|>hi---1024"
    tokenizer.chat_template = source
    assert tokenizer.apply_chat_template(MESSAGES) == "<|user|>hi---1024"


@pytest.mark.parametrize("name", list(BOMBS))
def test_a_template_bomb_is_refused_fast_with_bounded_memory(tokenizer, name, monkeypatch):
    """Through the tokenizer, as the server renders (a ChatTemplateError is the request's 400)."""
    source, stopped_by = BOMBS[name]
    timed = "took longer than" in stopped_by
    # A bomb meant for another limit gets time enough that a busy machine cannot let the clock stop it
    # first (the recursion took 0.5 s in a loaded suite run, 10 ms alone); it must still end quickly.
    monkeypatch.setattr(tokenizer, "template_limits", LIMITS if timed else replace(LIMITS, time_limit_s=30.0))
    tokenizer.chat_template = source
    started = time.monotonic()
    with pytest.raises(ChatTemplateError, match=re.escape(stopped_by)):
        tokenizer.apply_chat_template(MESSAGES)
    assert time.monotonic() - started < (LIMITS.time_limit_s + within(1.5) if timed else within(5.0)), name


def test_a_template_that_does_not_compile_is_a_chat_template_error(tokenizer):
    tokenizer.chat_template = "{% for m in messages %}"
    with pytest.raises(ChatTemplateError, match="does not compile"):
        tokenizer.apply_chat_template(MESSAGES)
