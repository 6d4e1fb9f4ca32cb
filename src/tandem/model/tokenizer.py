"""Tokenizer: tokenizer.json through the `tokenizers` library, chat templates through jinja2.

Templates render in a sandboxed jinja2 environment, as transformers does, because a model
directory is untrusted input, and under limits of time, output and size (tandem.model.chat_template).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from tokenizers import Tokenizer as HFTokenizer

from tandem.model.chat_template import ChatTemplateError, LimitedEnvironment, TemplateLimits, render_limited
from tandem.model.errors import ModelLoadError
from tandem.model.files import model_file

__all__ = ["Tokenizer", "ChatTemplateError", "IncrementalDetokenizer"]

GIL_FREE_ABOVE_CHARS = 4096  # longer texts are encoded with the GIL released


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    def __init__(self, model_dir: Path, template_limits: TemplateLimits | None = None) -> None:
        model_dir = Path(model_dir)
        self.template_limits = template_limits or TemplateLimits()
        path = model_file(model_dir, "tokenizer.json")
        if not path.is_file():
            raise ModelLoadError(f"{path}: missing (tandem needs a fast tokenizer's tokenizer.json)")
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as exc:  # the Rust library raises a bare Exception on bad files
            raise ModelLoadError(f"{path}: not a valid tokenizer file ({exc})") from None
        config_path = model_file(model_dir, "tokenizer_config.json")
        config: dict[str, Any] = {}
        if config_path.is_file():
            try:
                config = json.loads(config_path.read_text())
            except json.JSONDecodeError as exc:
                raise ModelLoadError(f"{config_path}: not valid JSON ({exc})") from None
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.pad_token = _token_text(config.get("pad_token"))
        self.bos_token_id = self._tok.token_to_id(self.bos_token) if self.bos_token else None
        self.eos_token_id = self._tok.token_to_id(self.eos_token) if self.eos_token else None
        template = config.get("chat_template")
        template_file = model_file(model_dir, "chat_template.jinja")  # transformers 5 saves it beside the config
        if template is None and template_file.is_file():
            template = template_file.read_text()
        if isinstance(template, list):  # named templates: take "default"
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        self.chat_template: str | None = template
        self._compiled = None
        self._compiled_source: str | None = None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if len(text) > GIL_FREE_ABOVE_CHARS:
            # The library's encode() holds the GIL throughout (seconds for a long prompt: every other
            # thread, a server's event loop included, would stall); encode_batch() releases it.
            return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def to_json(self) -> str:
        """The tokenizer as tokenizer.json text (what a grammar engine builds its token trie from)."""
        return self._tok.to_str()

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, tools: list[Any] | None = None
    ) -> str:
        if not self.chat_template:
            raise ChatTemplateError("this model's tokenizer_config.json has no chat_template")
        limits = self.template_limits
        if self._compiled is None or self._compiled_source != self.chat_template:
            self._compiled_source = self.chat_template
            env = LimitedEnvironment(limits.max_chars, trim_blocks=True, lstrip_blocks=True)

            def raise_exception(message: str) -> None:
                raise ChatTemplateError(message)

            env.globals["raise_exception"] = raise_exception
            try:
                self._compiled = env.from_string(self.chat_template)
            except TemplateError as exc:
                raise ChatTemplateError(f"the model's chat template does not compile: {exc}") from None
        context = {
            "messages": messages,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token or "",
            "eos_token": self.eos_token or "",
        }
        if tools:
            context["tools"] = tools  # what transformers passes: the request's tool definitions
        try:
            return render_limited(self._compiled, context, limits)
        except ChatTemplateError:
            raise
        except (TemplateError, ArithmeticError, LookupError, TypeError, ValueError, MemoryError, RecursionError) as exc:
            # Whatever the template does with these messages: the request's problem, never a 500.
            raise ChatTemplateError(f"chat template failed: {type(exc).__name__}: {exc}") from None


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas without re-decoding everything.

    Decodes a short window before the new tokens (byte-level BPE merges across token boundaries)
    and holds back text ending in U+FFFD, an incomplete UTF-8 sequence.
    """

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.ids = list(prompt_ids[-6:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix = self.tokenizer.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.tokenizer.decode(self.ids[self.prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            delta = full[len(prefix) :]
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return delta
        return ""
