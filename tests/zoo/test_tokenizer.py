"""The BPE tokenizer: exact round trips, <s> in front, and files transformers and tandem both read."""

import pytest
import transformers

from tandem.model.tokenizer import Tokenizer as TandemTokenizer
from tandem.zoo.tokenizer import CHAT_TEMPLATE, save_tokenizer, special_token_ids, train_tokenizer

CODE = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y = y\n",
    "for i in range(10):\n\tprint(i * i)  # tabs, too\n",
    "import os\nprint(os.getcwd())\n",
] * 30


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(CODE, vocab_size=400)


def test_special_tokens_come_first_and_bos_is_prepended(tokenizer):
    assert special_token_ids(tokenizer) == {"bos": 0, "eos": 1, "pad": 2}
    assert tokenizer.get_vocab_size() <= 400
    ids = tokenizer.encode("def add(a, b):").ids
    assert ids[0] == 0 and 0 not in ids[1:]
    assert tokenizer.encode("x", add_special_tokens=False).ids[0] != 0


@pytest.mark.parametrize("text", ["    return a + b\n", "\tx = '\u00e9\u4e2d\U0001f600'\n", "  \n\n   z"])
def test_byte_level_round_trip_is_exact_even_for_unseen_characters(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text).ids) == text


def test_learned_merges_cover_common_code(tokenizer):
    assert len(tokenizer.encode("def add(a, b):\n    return a + b\n", add_special_tokens=False).ids) < 14


def test_saved_files_load_in_transformers_and_tandem_alike(tokenizer, tmp_path):
    save_tokenizer(tokenizer, tmp_path, model_max_length=512)
    text = "class Point:\n    def __init__(self, x, y):\n"
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    ours = TandemTokenizer(tmp_path)
    assert hf(text).input_ids == ours.encode(text) == tokenizer.encode(text).ids
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (0, 1, 2)
    assert (ours.bos_token_id, ours.eos_token_id) == (0, 1)
    assert hf.model_max_length == 512
    messages = [{"role": "user", "content": "Sort a list."}]
    assert ours.apply_chat_template(messages) == "# user:\nSort a list.\n# assistant:\n"
    assert hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == ours.apply_chat_template(
        messages
    )
    assert ours.chat_template == CHAT_TEMPLATE
