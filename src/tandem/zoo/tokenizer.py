"""Training the bundled models' tokenizer: byte-level BPE with the `tokenizers` library.

Byte-level means every string encodes (no unknown token) and decoding is exact, which matters for
code: indentation and rare characters survive a round trip. The tokenizer adds <s> in front of
every encoded text, the way each training file starts, so a prompt looks like the start of a file.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

__all__ = [
    "BOS_TOKEN",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "CHAT_TEMPLATE",
    "train_tokenizer",
    "save_tokenizer",
    "special_token_ids",
]

BOS_TOKEN, EOS_TOKEN, PAD_TOKEN = "<s>", "</s>", "<pad>"
SPECIAL_TOKENS = [BOS_TOKEN, EOS_TOKEN, PAD_TOKEN]  # ids 0, 1, 2, in this order

# A code model has no chat training; turns become comment headers, so a chat prompt reads as code.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '# ' + message['role'] + ':\\n' + message['content'] + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '# assistant:\\n' }}{% endif %}"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 8192, min_frequency: int = 2) -> Tokenizer:
    """Byte-level BPE with `vocab_size` entries in all (256 bytes, merges, 3 special tokens)."""
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    bos = tokenizer.token_to_id(BOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B", special_tokens=[(BOS_TOKEN, bos)]
    )
    return tokenizer


def special_token_ids(tokenizer: Tokenizer) -> dict[str, int]:
    names = {"bos": BOS_TOKEN, "eos": EOS_TOKEN, "pad": PAD_TOKEN}
    return {name: tokenizer.token_to_id(token) for name, token in names.items()}


def save_tokenizer(tokenizer: Tokenizer, out_dir: str | Path, model_max_length: int) -> None:
    """tokenizer.json and tokenizer_config.json, as transformers' PreTrainedTokenizerFast reads them."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
