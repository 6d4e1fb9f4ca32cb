"""Engine: one replica's synchronous core: add_request, step, abort.

A step has three phases, as nano-vllm's engine reads:

1. schedule: the Batcher (no torch) admits waiting requests (each gets the cached KV blocks its
   prompt starts with, and a reservation of blocks), picks this step's prompt chunks and decoding
   rows, and the speculator (if any) drafts tokens for the decoding rows it chooses;
2. run: the ModelRunner (no queues) runs the prompt chunks, the decode rows and the rows verifying
   proposals in one ragged forward over the paged KV cache, each row through its block table;
3. post-process: prompt logprobs, sampling or verification, stop rules, outputs, and finished
   sequences' blocks handed back (their full blocks stay cached).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

import torch

from tandem.engine.batcher import Batcher, StepPlan
from tandem.engine.config import EngineConfig, kv_dtype_named
from tandem.engine.errors import PromptTooLongError, RequestError
from tandem.engine.grammar import GrammarCompiler
from tandem.engine.grammar_drafts import with_forced_tokens
from tandem.engine.grammar_mask import apply_grammars
from tandem.engine.kv_event_log import KVEventLog
from tandem.engine.model_runner import ModelRunner, joined_rows
from tandem.engine.outputs import RequestMetrics, RequestOutput
from tandem.engine.processor_tables import ProcessorTables, prepare_tables
from tandem.engine.processors import LogitsRow, process_logits
from tandem.engine.sampler import logprob_entries, new_generator, sample
from tandem.engine.sampling_params import GrammarSpec, SamplingParams
from tandem.engine.sequence import Sequence
from tandem.engine.speculation import Proposal, StepFeedback, draft, verify
from tandem.engine.step_batch import StepBatch
from tandem.model.loader import Model
from tandem.model.tokenizer import IncrementalDetokenizer
from tandem.optimize.types import OptimizedModel

__all__ = ["Engine", "EngineConfig", "RequestError", "PromptTooLongError"]


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
        block_size = config.prefix_block_size
        if block_size < 1:
            raise ValueError(f"prefix_block_size must be >= 1, got {block_size}")
        num_blocks = -(-config.kv_cache_tokens // block_size)  # the budget in whole blocks
        if config.kv_cache_tokens < self.max_model_len:
            raise ValueError(
                f"kv_cache_tokens {config.kv_cache_tokens} is below max_model_len {self.max_model_len}: "
                "no sequence would fit"
            )
        # Sequences running at once: as many as could each grow to the whole context (so the serving
        # layer's admission and a draft model's per-slot cache keep their bounds); the blocks they
        # hold are what they use, and cached prefixes live in every block no sequence holds.
        num_slots = min(config.max_num_seqs, config.kv_cache_tokens // self.max_model_len)
        kv_dtype = kv_dtype_named(optimized.kv_cache_dtype)
        self.runner = ModelRunner(model.module, num_blocks, block_size, self.max_model_len, kv_dtype)
        # Every block the cache stores or evicts, numbered (GET /kv/events); numbers start at the
        # wall-clock microseconds, so a reader's position from before a restart reads as a reset.
        self.kv_events = KVEventLog(block_size, config.kv_hash_seed, first_seq=time.time_ns() // 1000)
        self.batcher = Batcher(
            num_slots,
            config.max_prefill_tokens,
            config.enable_prefix_caching,
            block_size,
            max_group_share=config.max_request_share,
            num_blocks=num_blocks,
            hash_seed=config.kv_hash_seed,
            events=self.kv_events,
        )
        self.clock = clock
        self._eos = frozenset(model.eos_token_ids)
        self._ids = itertools.count()
        self._live: dict[str, Sequence] = {}
        self.num_prompt_tokens = 0
        self.num_generated_tokens = 0
        self.num_drafted_tokens = 0  # speculative recipes: tokens proposed, and accepted by the target
        self.num_accepted_tokens = 0
        self.num_spec_rows = 0  # sequence-steps decoded speculatively
        self.accepted_per_position: list[int] = []  # [i]: verified rows whose draft token i was accepted
        # Told each step's tokens (prompt tokens prefilled + tokens generated): the server's
        # iteration_tokens_total histogram. Runs on the stepping thread.
        self.on_step: Callable[[int], None] | None = None
        self._grammars: GrammarCompiler | None = None
        self._grammars_lock = threading.Lock()
        self.grammar_mask_seconds = 0.0  # time spent computing and applying grammar masks
        self.grammar_mask_steps = 0  # steps that masked at least one row
        # Tokens a grammar forced, verified as drafts (tandem.engine.grammar_drafts); off: one a step.
        self.forced_drafts = True
        self.num_forced_tokens = 0
        self.speculator = optimized.speculator
        if self.speculator is not None:
            self.speculator.bind(num_slots, self.max_model_len)

    # -- requests -----------------------------------------------------------------------------

    def add_request(
        self,
        prompt: str | list[int],
        params: SamplingParams | None = None,
        request_id: str | None = None,
        *,
        group: str | None = None,
        tables: ProcessorTables | None = None,
        continued: int = 0,
        released: int = 0,
        priority: int = 0,
    ) -> str:
        """Queue a request. `group`: the API request it is a choice of (one request's choices share
        the KV slots fairly with others); `tables`: its precomputed processor tables
        (`processor_tables(params)`, built now when not given). `continued`: the prompt's last
        `continued` ids are output another replica already generated (a resumed stream): their text
        is decoded as the output's (stop strings and multi-byte characters across the break come out
        as in one run), and its first `released` characters were already sent, so they are not again."""
        params = params or SamplingParams()
        request_id = request_id if request_id is not None else f"req-{next(self._ids)}"
        if request_id in self._live:
            raise RequestError(f"request id {request_id!r} is already in use")
        ids = self.validate_prompt(prompt)
        self.validate_params(params)
        seq = Sequence(
            request_id=request_id,
            prompt_ids=ids,
            params=params,
            detokenizer=IncrementalDetokenizer(self.model.tokenizer, ids[: len(ids) - continued]),
            eos_ids=self._eos,
            max_len=self.max_model_len,
            metrics=RequestMetrics(arrival_time=self.clock()),
        )
        if continued:
            seq.text = "".join(seq.detokenizer.push(t) for t in ids[len(ids) - continued :])
            seq.released = min(released, len(seq.text))
        if tables is None and params.processes_logits:
            tables = self.processor_tables(params)
        seq.tables, seq.group, seq.priority = tables, group, priority
        if params.grammar is not None:
            seq.grammar = self.grammar_state(params.grammar)
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
        if len(ids) >= self.max_model_len:  # first: a huge list is refused without a scan
            raise PromptTooLongError(
                f"the prompt has {len(ids)} tokens; this model's context is {self.max_model_len} tokens "
                "and at least one must remain for the output"
            )
        vocab = self.model.config.vocab_size
        if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab for t in ids):
            raise RequestError(f"prompt token ids must be integers in [0, {vocab})")
        return ids

    @property
    def grammars(self) -> GrammarCompiler:
        """The grammar compiler over this model's tokenizer (built on first use; its cache is per spec)."""
        with self._grammars_lock:  # the server's planning threads and the engine thread both get here
            if self._grammars is None:
                self._grammars = GrammarCompiler(
                    self.model.tokenizer.to_json(), self.model.config.vocab_size, self._eos
                )
        return self._grammars

    def check_grammar(self, spec: GrammarSpec) -> None:
        """Raise RequestError (GrammarError) naming what is wrong with a grammar spec (safe from any thread)."""
        self.grammars.check(spec)

    def grammar_state(self, spec: GrammarSpec):
        return self.grammars.state(spec)

    def validate_params(self, params: SamplingParams) -> None:
        """Check what SamplingParams cannot check alone: token ids within this model's vocabulary."""
        vocab = self.model.config.vocab_size
        for name, ids in (("logit_bias", (t for t, _ in params.logit_bias)), ("stop_token_ids", params.stop_token_ids)):
            outside = next((t for t in ids if t >= vocab), None)
            if outside is not None:
                raise RequestError(f"{name}: token id {outside} is outside the vocabulary [0, {vocab})")

    def processor_tables(self, params: SamplingParams) -> ProcessorTables:
        """What `params`' logits processors need, computed once (bad words tokenized as vLLM does).
        Touches no engine state: a server builds them in a worker thread, once per request.
        RequestError for a bad word over MAX_BAD_WORD_TOKENS tokens."""
        encode = self.model.tokenizer.encode
        return prepare_tables(params, self._eos, lambda w: encode(w, add_special_tokens=False))

    def abort(self, request_id: str) -> bool:
        """Stop a request now; its KV blocks are free for the next step. False if it was not live."""
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
    def prefill_tokens(self) -> int:
        """Prompt tokens admitted or waiting that are not prefilled yet (GET /load's `prefill_tokens`).
        Read from another thread: a snapshot of the lists, approximate by a step at most."""
        running = [s for s in list(self.batcher.running) if s.in_prefill]
        waiting = list(self.batcher.waiting)
        left = sum(max(0, len(s.prompt_ids) - s.num_computed) for s in running)
        return left + sum(len(s.prompt_ids) for s in waiting)

    @property
    def kv_used(self) -> float:
        """The fraction of the KV cache's blocks held by running sequences (a shared block counts
        once; cached blocks nobody holds are free); GET /load reports it."""
        pool = self.batcher.kv.pool
        return pool.num_used_blocks / pool.num_blocks

    @property
    def kv_block_size(self) -> int:
        return self.batcher.kv.block_size

    @property
    def kv_hash_seed(self) -> int:
        return self.batcher.kv.hash_seed

    # -- the step -----------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        started = self.clock()
        plan = self.batcher.schedule()
        if plan.empty:
            return []
        batch = self._with_drafts(plan)
        batch.started = started
        logits = self._run(batch)
        before = self.num_prompt_tokens + self.num_generated_tokens
        outputs = self._postprocess(batch, logits)
        if self.on_step is not None:
            self.on_step(self.num_prompt_tokens + self.num_generated_tokens - before)
        return outputs

    # 1. schedule (the Batcher's plan) and draft

    def _with_drafts(self, plan: StepPlan) -> StepBatch:
        """The step's rows: prompt chunks (scored at their last token, or at every token when the
        request wants prompt logprobs), decode rows (their last token), and rows verifying draft
        tokens (last token + proposals, all scored)."""
        now = self.clock()
        num_prefill = sum(chunk for _, chunk in plan.prefill)
        batch = StepBatch(plan.prefill, plan.decode, self._propose(plan.decode, num_prefill))
        batch.draft_seconds = self.clock() - now
        for seq, chunk in plan.prefill:
            if seq.metrics.first_scheduled_time is None:
                seq.metrics.first_scheduled_time = now
            # A request scoring its prompt needs logits at every prompt position; others at the last.
            scored = chunk if seq.params.prompt_logprobs is not None else 1
            batch.add_row(seq, seq.prompt_ids[seq.num_computed : seq.num_computed + chunk], scored)
        for seq, proposal in zip(plan.decode, batch.proposals, strict=True):
            row = [seq.output_ids[-1], *(proposal.tokens if proposal else ())]
            if proposal:
                self.batcher.grow(seq, seq.num_computed + len(row))  # blocks for the proposals' positions
            batch.add_row(seq, row, len(row))
        return batch

    def _propose(self, decode: list[Sequence], num_prefill_tokens: int) -> list[Proposal | None]:
        """Draft tokens for the decoding rows the speculator picks, and the tokens constrained rows'
        grammars force after them (None: the row decodes plainly)."""
        # Each row writes k + 1 positions from its last token: stay inside the slot, and draft no more
        # than the request can still emit (a step emits up to k + 1 tokens).
        room = [max(0, min(self.max_model_len - s.length, s.params.max_tokens - len(s.output_ids) - 1)) for s in decode]
        proposals = draft(self.speculator, decode, num_prefill_tokens, room)
        if self.forced_drafts and any(s.grammar is not None for s in decode):
            proposals, forced = with_forced_tokens(decode, proposals, room)  # tandem.engine.grammar_drafts
            self.num_forced_tokens += forced
        return proposals

    # 2. run

    def _run(self, batch: StepBatch) -> list[torch.Tensor]:
        return self.runner.forward_scored(batch.rows, batch.tables, batch.starts, batch.scored)

    # 3. post-process

    def _postprocess(self, batch: StepBatch, logits: list[torch.Tensor]) -> list[RequestOutput]:
        results: list[tuple[Sequence, list[int], list]] = []
        plain: list[tuple[Sequence, torch.Tensor]] = []  # rows sampled from their last position
        for (seq, chunk), row_logits in zip(batch.prefill, logits, strict=False):
            start = seq.num_computed
            seq.num_computed += chunk
            self.num_prompt_tokens += chunk
            if seq.params.prompt_logprobs is not None:
                self._score_prompt(seq, start, row_logits)
            if seq.prefilled:
                if seq.params.max_tokens == 0:  # scoring the prompt was the whole request
                    seq.finish("length")
                    results.append((seq, [], []))
                else:
                    plain.append((seq, row_logits[-1:]))
        verified: list[tuple[Sequence, Proposal, torch.Tensor]] = []
        for seq, proposal, row_logits in zip(batch.decode, batch.proposals, logits[len(batch.prefill) :], strict=True):
            if proposal is not None:
                verified.append((seq, proposal, row_logits))
            else:
                seq.num_computed += 1  # the fed token's keys and values are now cached
                plain.append((seq, row_logits))
        raw, processed = self._process(plain, verified)
        n = len(plain)  # one row each
        if plain:
            results += self._sample([s for s, _ in plain], processed[:n], raw[:n])
        if verified:
            results += self._accept(batch, verified, processed[n:], raw[n:])
        outputs = self._emit(results)
        if self.speculator is not None and batch.decode:
            # What adaptive speculators learn from: outcomes, and what the step cost besides drafting
            # (told before finished sequences are released, so their outcomes count too).
            seconds = self.clock() - batch.started - batch.draft_seconds
            self.speculator.observe(
                StepFeedback(
                    batch.verified, batch.drafted, batch.accepted, len(batch.decode), batch.num_tokens, seconds
                )
            )
        for seq in self.batcher.release_finished():
            self._retire(seq)
        return outputs

    def _score_prompt(self, seq: Sequence, start: int, logits: torch.Tensor) -> None:
        """Logprobs of prompt tokens start + 1 .. start + chunk (logits row j predicts position start + j + 1)."""
        if start == 0:
            seq.prompt_logprobs.append(None)  # nothing predicts the first token
        targets = seq.prompt_ids[start + 1 : start + 1 + logits.shape[0]]
        if targets:
            logprobs = torch.log_softmax(logits[: len(targets)], dim=-1)
            seq.prompt_logprobs += logprob_entries(logprobs, targets, seq.params.prompt_logprobs)

    def _process(
        self, plain: list[tuple[Sequence, torch.Tensor]], verified: list[tuple[Sequence, Proposal, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(raw, processed) logits of every row, through the requests' processors in one batch: plain
        rows first, then each verified row's k + 1 positions, position j with the first j proposals
        as part of its history."""
        pieces = [lg for _, lg in plain] + [lg for *_, lg in verified]
        if not pieces:
            return torch.empty(0), torch.empty(0)
        rows = [LogitsRow(seq) for seq, _ in plain]
        rows += [LogitsRow(seq, tuple(p.tokens[:j])) for seq, p, lg in verified for j in range(len(lg))]
        raw = joined_rows(pieces)
        processed = process_logits(raw, rows)
        if any(row.seq.grammar is not None for row in rows):
            started = time.perf_counter()
            processed = apply_grammars(processed, rows, raw)
            self.grammar_mask_seconds += time.perf_counter() - started
            self.grammar_mask_steps += 1
        return raw, processed

    def _sample(
        self, seqs: list[Sequence], logits: torch.Tensor, raw: torch.Tensor
    ) -> list[tuple[Sequence, list[int], list]]:
        tokens, logprobs = sample(logits, [s.params for s in seqs], [s.generator for s in seqs], raw)
        return [(s, [t], [lp]) for s, t, lp in zip(seqs, tokens, logprobs, strict=True)]

    def _accept(
        self,
        batch: StepBatch,
        verified: list[tuple[Sequence, Proposal, torch.Tensor]],
        processed: torch.Tensor,
        raw: torch.Tensor,
    ) -> list[tuple[Sequence, list[int], list]]:
        """Verify rows' proposals against the target's processed logits (the rows' positions one after
        another); advance their KV positions."""
        seqs, proposals = [s for s, _, _ in verified], [p for _, p, _ in verified]
        sizes = [len(lg) for _, _, lg in verified]
        checked = verify(seqs, proposals, list(processed.split(sizes)), list(raw.split(sizes)))
        results, drafted, accepted = [], [], []
        for seq, proposal, (tokens, logprobs) in zip(seqs, proposals, checked, strict=True):
            seq.num_computed += len(tokens)  # the fed last token plus the accepted proposals hold valid KV
            drafted.append(len(proposal.tokens))
            accepted.append(len(tokens) - 1)
            seq.metrics.num_drafted_tokens += drafted[-1]
            seq.metrics.num_accepted_tokens += accepted[-1]
            self._count_accepted_positions(accepted[-1])
            results.append((seq, tokens, logprobs))
        self.num_drafted_tokens += sum(drafted)
        self.num_accepted_tokens += sum(accepted)
        self.num_spec_rows += len(seqs)
        batch.verified, batch.drafted, batch.accepted = seqs, drafted, accepted
        return results

    def _count_accepted_positions(self, accepted: int) -> None:
        """Acceptance stops at the first rejected draft token: positions 0 .. accepted - 1 were accepted."""
        counts = self.accepted_per_position
        counts.extend([0] * (accepted - len(counts)))
        for position in range(accepted):
            counts[position] += 1

    def _emit(self, results: list[tuple[Sequence, list[int], list]]) -> list[RequestOutput]:
        """Append the step's tokens (stop rules apply per token) and report each sequence."""
        outputs: list[RequestOutput] = []
        now = self.clock()
        for seq, tokens, logprobs in results:
            appended = []
            for token, logprob in zip(tokens, logprobs, strict=True):
                seq.append(token, logprob)
                appended.append(token)
                if seq.finished:
                    break
            if seq.metrics.first_token_time is None:
                seq.metrics.first_token_time = now
            seq.metrics.last_token_time = now
            self.num_generated_tokens += len(appended)
            outputs.append(seq.take_output(appended))
        return outputs

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

    @property
    def prefix_cache_queries(self) -> int:
        """Prompt tokens looked up in the prefix cache (vLLM's prefix_cache_queries)."""
        return self.batcher.kv.num_queried_tokens

    @property
    def prefix_cache_hits(self) -> int:
        """Of those, tokens whose keys and values were reused (vLLM's prefix_cache_hits)."""
        return self.batcher.kv.num_hit_tokens

    # -- convenience --------------------------------------------------------------------------

    def generate(
        self, prompts: Iterable[str | list[int]], params: SamplingParams | list[SamplingParams] | None = None
    ) -> list[RequestOutput]:
        """Run prompts to completion together (continuous batching); final outputs in prompt order,
        each holding all its logprobs and prompt logprobs (a step's output holds only that step's)."""
        prompts = list(prompts)
        per = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, per, strict=True)]
        final: dict[str, RequestOutput] = {}
        logprobs: dict[str, list] = {i: [] for i in ids}
        prompt_logprobs: dict[str, list | None] = {i: None for i in ids}
        while any(i not in final for i in ids):
            for out in self.step():
                logprobs[out.request_id] += out.logprobs or ()
                if out.prompt_logprobs is not None:
                    prompt_logprobs[out.request_id] = out.prompt_logprobs
                if out.finished:
                    final[out.request_id] = out
        return [
            replace(
                final[i],
                logprobs=logprobs[i] if final[i].logprobs is not None else None,
                prompt_logprobs=prompt_logprobs[i],
            )
            for i in ids
        ]
