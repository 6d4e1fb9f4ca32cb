"""Engine: one replica's synchronous core: add_request, step, abort.

Each step() asks the Batcher for a plan, asks the speculator (if any, and the decode batch is small
enough) for draft tokens, runs the prompt chunks, the decode rows and the rows verifying proposals
through the ModelRunner in one ragged forward, samples or verifies, applies stop rules, and frees
finished sequences' KV slots.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from tandem.contracts import OptimizedModel
from tandem.engine.batcher import Batcher
from tandem.engine.model_runner import ModelRunner
from tandem.engine.outputs import RequestMetrics, RequestOutput
from tandem.engine.sampler import new_generator, sample
from tandem.engine.sampling_params import SamplingParams
from tandem.engine.sequence import Sequence
from tandem.engine.speculation import Proposal, verify
from tandem.model.loader import Model
from tandem.model.tokenizer import IncrementalDetokenizer

__all__ = ["Engine", "EngineConfig", "RequestError", "PromptTooLongError"]


class RequestError(ValueError):
    """A request the engine refuses at admission; the message says why."""


class PromptTooLongError(RequestError):
    pass


@dataclass(frozen=True)
class EngineConfig:
    max_model_len: int | None = None  # context limit per sequence; default min(model's, 2048)
    kv_cache_tokens: int = 32768  # KV memory budget in tokens, preallocated as slots of max_model_len
    max_num_seqs: int = 64  # upper bound on concurrently running sequences
    max_prefill_tokens: int = 512  # prompt tokens prefilled per step, so long prompts don't stall decode
    num_threads: int | None = None  # torch threads for this engine; default all cores

    def resolve_max_len(self, model_max: int) -> int:
        limit = self.max_model_len or min(model_max, 2048)
        if limit > model_max:
            raise ValueError(f"max_model_len {limit} exceeds the model's max_position_embeddings {model_max}")
        return limit


def _kv_dtype(name: str | None) -> torch.dtype | None:
    if name is None:
        return None
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"kv_cache_dtype {name!r} is not a torch floating-point dtype")
    return dtype


class Engine:
    def __init__(
        self,
        model: Model | OptimizedModel,
        config: EngineConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Run `model` (a loaded Model, or an OptimizedModel from a recipe). The engine takes
        ownership of the model's weights: it packs them for its kernels in place."""
        optimized = model if isinstance(model, OptimizedModel) else OptimizedModel(model=model)
        self.optimized = optimized
        self.recipe = optimized.recipe
        self.model = model = optimized.model
        self.config = config = config or EngineConfig()
        torch.set_num_threads(config.num_threads or os.cpu_count() or 1)
        self.max_model_len = config.resolve_max_len(model.config.max_position_embeddings)
        num_slots = min(config.max_num_seqs, config.kv_cache_tokens // self.max_model_len)
        if num_slots < 1:
            raise ValueError(
                f"kv_cache_tokens {config.kv_cache_tokens} is below max_model_len {self.max_model_len}: "
                "no sequence would fit"
            )
        kv_dtype = _kv_dtype(optimized.kv_cache_dtype)
        self.runner = ModelRunner(model.module, num_slots, self.max_model_len, kv_dtype)
        self.batcher = Batcher(num_slots, config.max_prefill_tokens)
        self.clock = clock
        self._eos = frozenset(model.eos_token_ids)
        self._ids = itertools.count()
        self._live: dict[str, Sequence] = {}
        self.num_prompt_tokens = 0
        self.num_generated_tokens = 0
        self.num_drafted_tokens = 0  # speculative recipes: tokens proposed, and accepted by the target
        self.num_accepted_tokens = 0
        self.num_spec_rows = 0  # sequence-steps decoded speculatively
        self.speculator = optimized.speculator
        if self.speculator is not None:
            self.speculator.bind(num_slots, self.max_model_len)

    # -- requests -----------------------------------------------------------------------------

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
    ) -> str:
        params = params or SamplingParams()
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self._live:
            raise RequestError(f"request id {request_id!r} is already in use")
        ids = self.validate_prompt(prompt)
        seq = Sequence(
            request_id=request_id,
            prompt_ids=ids,
            params=params,
            detokenizer=IncrementalDetokenizer(self.model.tokenizer, ids),
            eos_ids=self._eos,
            max_len=self.max_model_len,
            metrics=RequestMetrics(arrival_time=self.clock()),
        )
        if not params.greedy:
            seq.generator = new_generator(params.seed)
        self._live[request_id] = seq
        self.batcher.add(seq)
        return request_id

    def validate_prompt(self, prompt: str | list[int]) -> list[int]:
        """Tokenize and check a prompt without touching engine state (safe from any thread)."""
        ids = self.model.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise RequestError("the prompt is empty")
        vocab = self.model.config.vocab_size
        if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab for t in ids):
            raise RequestError(f"prompt token ids must be integers in [0, {vocab})")
        if len(ids) >= self.max_model_len:
            raise PromptTooLongError(
                f"the prompt has {len(ids)} tokens; this model's context is {self.max_model_len} tokens "
                "and at least one must remain for the output"
            )
        return ids

    def abort(self, request_id: str) -> bool:
        """Stop a request now; its KV slot is free for the next step. False if it was not live."""
        seq = self.batcher.abort(request_id)
        if seq is None:
            return False
        self._retire(seq)
        return True

    def has_unfinished(self) -> bool:
        return self.batcher.has_unfinished()

    @property
    def num_running(self) -> int:
        return len(self.batcher.running)

    @property
    def num_waiting(self) -> int:
        return len(self.batcher.waiting)

    @property
    def kv_used(self) -> float:
        """The fraction of the KV cache held by running sequences (slots in use / slots); GET /load reports it."""
        return len(self.batcher.running) / self.batcher.num_slots

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        plan = self.batcher.schedule()
        if plan.empty:
            return []
        now = self.clock()
        decode = plan.decode
        proposals = self._propose(decode)
        # One ragged forward for everything: prompt chunks (scored at their last token), decode rows
        # (their last token), and rows verifying draft tokens (last token + k proposals, all scored).
        rows: list[list[int]] = []
        for seq, chunk in plan.prefill:
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = now
            rows.append(seq.prompt_ids[seq.num_computed : seq.num_computed + chunk])
        for i, seq in enumerate(decode):
            rows.append([seq.output_ids[-1], *(proposals[i].tokens if proposals else ())])
        seqs = [seq for seq, _ in plan.prefill] + decode
        scored = [1] * len(plan.prefill) + [len(row) for row in rows[len(plan.prefill) :]]
        logits = self.runner.forward_scored(rows, [s.slot for s in seqs], [s.num_computed for s in seqs], scored)
        results: list[tuple[Sequence, list[int], list]] = []
        plain = []  # rows sampled from their last position: finished prompts, decode rows without proposals
        for i, (seq, _) in enumerate(plan.prefill):
            seq.num_computed += len(rows[i])
            self.num_prompt_tokens += len(rows[i])
            if seq.num_computed == len(seq.prompt_ids):
                plain.append(i)
        verified = []  # decode rows with proposals: (row, proposal)
        for j, seq in enumerate(decode):
            if proposals and proposals[j].tokens:
                verified.append((len(plan.prefill) + j, proposals[j]))
            else:
                seq.num_computed += 1  # the fed token's keys and values are now cached
                plain.append(len(plan.prefill) + j)
        if plain:
            results += self._sample_one([seqs[i] for i in plain], torch.cat([logits[i] for i in plain]))
        if verified:
            results += self._accept(
                [seqs[i] for i, _ in verified], [p for _, p in verified], [logits[i] for i, _ in verified]
            )
        outputs: list[RequestOutput] = []
        now = self.clock()
        for seq, tokens, logprobs in results:
            appended = []
            for token, logprob in zip(tokens, logprobs, strict=True):
                seq.append(token, logprob)
                appended.append(token)
                if seq.finished:
                    break
            self._stamp(seq, now)
            self.num_generated_tokens += len(appended)
            outputs.append(seq.take_output(appended))
        for seq in self.batcher.release_finished():
            self._retire(seq)
        return outputs

    def _sample_one(self, seqs: list[Sequence], logits: torch.Tensor) -> list[tuple[Sequence, list[int], list]]:
        tokens, logprobs = sample(logits, [s.params for s in seqs], [s.generator for s in seqs])
        return [(s, [t], [lp]) for s, t, lp in zip(seqs, tokens, logprobs, strict=True)]

    def _propose(self, decode: list[Sequence]) -> list[Proposal] | None:
        """Draft tokens for the decoding rows when a speculator is attached and the batch is small
        enough for verification to pay; None to decode plainly."""
        spec = self.speculator
        if not decode or spec is None or len(decode) > spec.max_batch:
            return None
        # Each row writes k + 1 positions starting at its last token: stay inside the KV slot.
        k = min(spec.k, min(self.max_model_len - s.length for s in decode))
        if k <= 0:
            return None
        proposals = spec.propose(decode, k)
        return proposals if any(p.tokens for p in proposals) else None

    def _accept(
        self, seqs: list[Sequence], proposals: list[Proposal], logits: list[torch.Tensor]
    ) -> list[tuple[Sequence, list[int], list]]:
        """Verify rows' proposals against the target's logits; advance their KV positions."""
        results = []
        for seq, proposal, (tokens, logprobs) in zip(seqs, proposals, verify(seqs, proposals, logits), strict=True):
            seq.num_computed += len(tokens)  # the fed last token plus the accepted proposals hold valid KV
            drafted, accepted = len(proposal.tokens), len(tokens) - 1
            seq.metrics.num_drafted_tokens += drafted
            seq.metrics.num_accepted_tokens += accepted
            self.num_drafted_tokens += drafted
            self.num_accepted_tokens += accepted
            results.append((seq, tokens, logprobs))
        self.num_spec_rows += len(seqs)
        return results

    def _retire(self, seq: Sequence) -> None:
        seq.metrics.finished_time = self.clock()
        self._live.pop(seq.request_id, None)
        if self.speculator is not None:
            self.speculator.release(seq)

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens over the engine's life (0 when nothing was drafted)."""
        return self.num_accepted_tokens / self.num_drafted_tokens if self.num_drafted_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens gained per speculative row-step: accepted proposals plus the target's own token."""
        return (self.num_accepted_tokens + self.num_spec_rows) / self.num_spec_rows if self.num_spec_rows else 0.0

    def _stamp(self, seq: Sequence, now: float) -> None:
        if seq.metrics.first_token_time is None:
            seq.metrics.first_token_time = now
        seq.metrics.last_token_time = now

    # -- convenience --------------------------------------------------------------------------

    def generate(
        self, prompts: Iterable[str | list[int]], params: SamplingParams | list[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        """Run prompts to completion together (continuous batching); final outputs in prompt order."""
        prompts = list(prompts)
        per = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, per, strict=True)]
        final: dict[str, RequestOutput] = {}
        while any(i not in final for i in ids):
            for out in self.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[i] for i in ids]
