"""Tokenizer: tokenizer.json through the `tokenizers` library, chat templates through jinja2.

Templates render in a sandboxed jinja2 environment, as transformers does, because a model
directory is untrusted input.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from tandem.model.errors import ModelLoadError

__all__ = ["Tokenizer", "ChatTemplateError", "IncrementalDetokenizer"]


class ChatTemplateError(ValueError):
    """The chat template refused the messages (e.g. raise_exception) or is missing."""


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    def __init__(self, model_dir: Path) -> None:
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise ModelLoadError(f"{path}: missing (tandem needs a fast tokenizer's tokenizer.json)")
        try:
            self._tok = HFTokenizer.from_file(str(path))
        except Exception as exc:  # the Rust library raises a bare Exception on bad files
            raise ModelLoadError(f"{path}: not a valid tokenizer file ({exc})") from None
        config_path = model_dir / "tokenizer_config.json"
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
        template_file = model_dir / "chat_template.jinja"  # transformers 5 saves it beside the config
        if template is None and template_file.is_file():
            template = template_file.read_text()
        if isinstance(template, list):  # named templates: take "default"
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        self.chat_template: str | None = template
        self._compiled = None

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise ChatTemplateError("this model's tokenizer_config.json has no chat_template")
        if self._compiled is None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

            def raise_exception(message: str) -> None:
                raise ChatTemplateError(message)

            env.globals["raise_exception"] = raise_exception
            self._compiled = env.from_string(self.chat_template)
        try:
            return self._compiled.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        except TemplateError as exc:
            raise ChatTemplateError(f"chat template failed: {exc}") from None


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
