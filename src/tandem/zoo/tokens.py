"""Token data for training and evaluation: files -> one token stream -> fixed-length windows.

Each file is encoded as <s> text </s> and the files are concatenated, so the model learns where
files start and end. Training batches are windows of seq_len + 1 tokens (inputs and next-token
targets); their order is a seeded permutation, so every build sees the same batches.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tokenizers import Tokenizer

from tandem.zoo.corpus import SourceFile

__all__ = ["encode_files", "eval_windows", "WindowSampler"]


def encode_files(tokenizer: Tokenizer, files: Sequence[SourceFile], bos_id: int, eos_id: int) -> torch.Tensor:
    """All files as one int64 stream: <s> file0 </s> <s> file1 </s> ..."""
    encodings = tokenizer.encode_batch([f.text for f in files], add_special_tokens=False)
    pieces = [torch.tensor([bos_id, *enc.ids, eos_id], dtype=torch.int64) for enc in encodings]
    return torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)


def eval_windows(stream: torch.Tensor, seq_len: int) -> list[torch.Tensor]:
    """Consecutive windows of up to seq_len + 1 tokens overlapping by one, covering every token once
    as a prediction target: window i predicts stream[i*seq_len + 1 : (i+1)*seq_len + 1]."""
    windows = []
    for start in range(0, max(len(stream) - 1, 0), seq_len):
        windows.append(stream[start : start + seq_len + 1])
    return windows


class WindowSampler:
    """Deterministic training batches [batch_size, seq_len + 1] drawn from a token stream.

    Epoch e cuts the stream into windows starting at a seeded offset (so windows straddle
    different boundaries each epoch) and visits them in a seeded random order.
    """

    def __init__(self, stream: torch.Tensor, seq_len: int, batch_size: int, seed: int) -> None:
        if len(stream) < seq_len + 1 + seq_len:
            raise ValueError(f"token stream of {len(stream)} tokens is too short for seq_len {seq_len}")
        self.stream, self.seq_len, self.batch_size, self.seed = stream, seq_len, batch_size, seed
        self._epoch = -1
        self._starts = torch.zeros(0, dtype=torch.int64)
        self._used = 0

    @property
    def windows_per_epoch(self) -> int:
        return (len(self.stream) - self.seq_len - 1 - (self.seq_len - 1)) // self.seq_len + 1

    def _next_epoch(self) -> None:
        self._epoch += 1
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self._epoch)
        offset = int(torch.randint(0, self.seq_len, (1,), generator=generator))
        starts = torch.arange(self.windows_per_epoch, dtype=torch.int64) * self.seq_len + offset
        self._starts = starts[torch.randperm(len(starts), generator=generator)]
        self._used = 0

    def next_batch(self) -> torch.Tensor:
        starts = []
        while len(starts) < self.batch_size:
            if self._used >= len(self._starts):
                self._next_epoch()
            take = min(self.batch_size - len(starts), len(self._starts) - self._used)
            starts.extend(self._starts[self._used : self._used + take].tolist())
            self._used += take
        span = torch.arange(self.seq_len + 1)
        return self.stream[torch.tensor(starts)[:, None] + span]

    @property
    def epochs_started(self) -> int:
        return self._epoch + 1
