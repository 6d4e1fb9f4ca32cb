"""Sequence: one request's state inside the engine (tokens, KV blocks, progress, stop checks). No torch."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Protocol

from tandem.engine.outputs import RequestMetrics, RequestOutput, TokenLogprob
from tandem.engine.sampling_params import SamplingParams

__all__ = ["Detokenizer", "Grammar", "Sequence", "SequenceStatus"]


class Detokenizer(Protocol):
    """Token ids in, text out, one token at a time (tandem.model.IncrementalDetokenizer)."""

    def push(self, token_id: int) -> str: ...


class Grammar(Protocol):
    """A sequence's output constraint (tandem.engine.grammar.GrammarState)."""

    @property
    def finished(self) -> bool: ...

    def consume(self, token_id: int) -> bool: ...


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Sequence:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    detokenizer: Detokenizer
    eos_ids: frozenset[int]
    max_len: int  # the context limit: prompt + output never exceed it
    metrics: RequestMetrics
    status: SequenceStatus = SequenceStatus.WAITING
    slot: int | None = None  # the sequence's index among the running ones (a draft model's own KV slot)
    num_computed: int = 0  # tokens whose keys/values are in the KV cache
    # The paged KV cache (tandem.engine.kv_blocks): the blocks holding the sequence's positions, the
    # hash chain of its full blocks (as far as computed), how many of its blocks are registered in
    # the block cache, and how many more blocks it was promised at admission.
    block_table: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    num_registered_blocks: int = 0
    blocks_promised: int = 0
    num_cached_tokens: int = 0  # prompt tokens taken from the prefix cache at admission
    output_ids: list[int] = field(default_factory=list)
    text: str = ""  # decoded output, including text held back for stop-string matching
    released: int = 0  # characters of `text` already reported
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    generator: object | None = None  # the per-request torch.Generator, owned by the sampler
    # params.prompt_logprobs: one entry per prompt token scored so far (None for the first token)
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)
    prompt_logprobs_sent: bool = False
    # params.bad_words as token sequences (tandem.engine.processor_tables.bad_words_token_ids); the
    # tables are built from them when the sequence came without `tables`
    bad_word_ids: tuple[tuple[int, ...], ...] = ()
    # params.grammar's matcher, set at admission; advanced by every appended token
    grammar: Grammar | None = None
    # The request's precomputed logits-processor tables (tandem.engine.processor_tables.ProcessorTables,
    # shared by its choices); None: built on first use
    tables: Any = None
    group: str | None = None  # the API request this sequence is a choice of (the Batcher's fair share)
    priority: int = 0  # vLLM's: waiting sequences are admitted lowest first, then in arrival order
    stop_ids: frozenset[int] = field(init=False)  # params.stop_token_ids as a set: one lookup per token

    def __post_init__(self) -> None:
        self.stop_ids = frozenset(self.params.stop_token_ids)

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.output_ids

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def in_prefill(self) -> bool:
        """True until every prompt token is in the KV cache and the first token is sampled."""
        return not self.output_ids

    @property
    def prefilled(self) -> bool:
        """Every prompt token's keys and values are in the KV cache."""
        return self.num_computed >= len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def append(self, token_id: int, logprob: TokenLogprob | None = None) -> None:
        """Add a sampled token and apply the stop rules (eos, stop ids, stop strings, lengths); before
        params.min_tokens tokens only the length limits apply (vLLM's rule)."""
        self.output_ids.append(token_id)
        if logprob is not None:
            self.pending_logprobs.append(logprob)
        params = self.params
        if self.grammar is not None:
            self.grammar.consume(token_id)
        may_stop = len(self.output_ids) >= params.min_tokens  # the processors keep EOS out before that
        is_eos = token_id in self.eos_ids and not params.ignore_eos
        if may_stop and (is_eos or token_id in self.stop_ids):
            self.finish("stop", None if is_eos else token_id)
            return
        before = len(self.text)
        self.text += self.detokenizer.push(token_id)
        for stop in params.stop if may_stop else ():
            # Only a match ending in the new text is new (earlier ones ended the sequence or came
            # before min_tokens).
            at = self.text.find(stop, max(0, before - len(stop) + 1))
            if at >= 0:
                self.text = self.text[: at + len(stop)] if params.include_stop_str_in_output else self.text[:at]
                self.finish("stop", stop)
                return
        if self.grammar is not None and self.grammar.finished:
            self.finish("stop")  # the output is complete: EOS is all the grammar allows (or it failed)
        elif len(self.output_ids) >= params.max_tokens or self.length >= self.max_len:
            self.finish("length")

    def finish(self, reason: str, stop_reason: str | int | None = None) -> None:
        self.status = SequenceStatus.FINISHED
        self.finish_reason, self.stop_reason = reason, stop_reason

    def take_output(self, new_ids: list[int]) -> RequestOutput:
        """The report for this step; text that might begin a stop string is held back until decided."""
        if self.finished:
            release_to = len(self.text)
        else:
            hold = max((len(s) - 1 for s in self.params.stop), default=0)
            release_to = max(self.released, len(self.text) - hold)
        new_text = self.text[self.released : release_to]
        self.released = release_to
        logprobs, self.pending_logprobs = self.pending_logprobs, []
        prompt_logprobs = None
        if self.params.prompt_logprobs is not None and self.prefilled and not self.prompt_logprobs_sent:
            prompt_logprobs, self.prompt_logprobs_sent = self.prompt_logprobs, True  # once, with the first output
        return RequestOutput(
            request_id=self.request_id,
            prompt_token_ids=self.prompt_ids,
            token_ids=list(self.output_ids),
            text=self.text[:release_to],
            new_token_ids=new_ids,
            new_text=new_text,
            finished=self.finished,
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            logprobs=logprobs if self.params.logprobs is not None else None,
            prompt_logprobs=prompt_logprobs,
            num_cached_tokens=self.num_cached_tokens,
            metrics=self.metrics,
        )
