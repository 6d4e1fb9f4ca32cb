"""Token-level agreement of one pair: how often the candidate predicts what the incumbent predicts.

Two ways to get it, the first preferred:
- teacher-forced: both variants score the same text (the prompt plus the incumbent's completion,
  sent back with `echo`), so every position of the completion is compared in the same context;
- shared prefix (servers without `echo`): the positions of the two generations up to and
  including the first token where they part. Up to there both saw the same context, so those
  positions are teacher-forced for free; after it the contexts differ and nothing is compared.
  Under greedy decoding each pair then adds d agreeing positions and one disagreeing one, which
  is the maximum-likelihood estimate of a per-position agreement rate (a geometric run length).

Agreement compares the two top-1 predictions at a position (for greedy requests the incumbent's
top-1 is its token). The log-likelihood gap is incumbent logprob minus candidate logprob of the
same token, per token: with requests sampled at temperature 1 its mean estimates
KL(incumbent || candidate); positive means the candidate finds the incumbent's text less likely.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from tandem.measure.logprobs import TokenTrack

__all__ = [
    "TokenAgreement",
    "TrackMismatch",
    "teacher_forced",
    "teacher_forced_kept",
    "shared_prefix",
    "completion_start",
]

TEACHER_FORCED = "teacher-forced"
SHARED_PREFIX = "shared-prefix"


class TrackMismatch(ValueError):
    """The two variants scored different token sequences (different tokenizers or texts)."""


@dataclass(frozen=True)
class TokenAgreement:
    method: str  # TEACHER_FORCED or SHARED_PREFIX
    positions: int  # positions whose top-1 predictions were compared
    agree: int  # ... and agreed
    gap_positions: int  # positions with both variants' logprob of the same token
    gap_sum: float  # sum over them of (incumbent logprob - candidate logprob), nats

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TokenAgreement:
        return cls(**raw)


def _compare(inc: TokenTrack, cand: TokenTrack, positions: range, gap_positions: range, method: str) -> TokenAgreement:
    compared = agree = gaps = 0
    gap_sum = 0.0
    for i in positions:
        a, b = inc.top1[i], cand.top1[i]
        if a is not None and b is not None:
            compared += 1
            agree += a == b
    for i in gap_positions:
        a, b = inc.logprobs[i], cand.logprobs[i]
        if a is not None and b is not None:
            gaps += 1
            gap_sum += a - b
    return TokenAgreement(method, compared, agree, gaps, gap_sum)


def completion_start(track: TokenTrack, echoed_text: str, completion_chars: int) -> int:
    """The first position of an echo's track that belongs to the completion (the last `completion_chars`).

    Offsets are aligned to the end of the echoed text, so a special token the server shows before
    the prompt (a BOS written as "<s>") cannot shift the boundary; without offsets, the tokens'
    lengths are summed. A token straddling the boundary counts as prompt.
    """
    n = len(track.tokens)
    if track.offsets is not None and n:
        ends = [o + len(t) for o, t in zip(track.offsets, track.tokens, strict=True)]
        shift = len(echoed_text) - ends[-1]
        starts = [o + shift for o in track.offsets]
    else:
        starts, at = [], len(echoed_text)
        for token in reversed(track.tokens):
            at -= len(token)
            starts.append(at)
        starts.reverse()
    boundary = len(echoed_text) - completion_chars
    return next((i for i, s in enumerate(starts) if s >= boundary), n)


def teacher_forced(inc: TokenTrack, cand: TokenTrack, start: int) -> TokenAgreement:
    """Compare the two echoes of one text from position `start` (the completion) on."""
    if inc.tokens != cand.tokens:
        raise TrackMismatch(f"the variants scored different tokens ({len(inc.tokens)} vs {len(cand.tokens)})")
    span = range(start, len(inc.tokens))
    return _compare(inc, cand, span, span, TEACHER_FORCED)


def teacher_forced_kept(kept: TokenTrack, cand: TokenTrack, start: int) -> TokenAgreement:
    """The incumbent's kept track (its completion's own tokens, logprobs taken while it generated them)
    against the candidate's echo of prompt + completion, whose completion starts at `start`.

    The same comparison as `teacher_forced`: at each completion position both saw the prompt and the
    incumbent's tokens before it, the incumbent while generating, the candidate teacher-forced. Where
    the echo tokenized the text another way from some position on (a stop string cut the last
    token, a character split across tokens), the contexts part there: positions up to it count."""
    span = cand.tokens[start:]
    shorter = min(len(kept.tokens), len(span))
    same = next((i for i in range(shorter) if kept.tokens[i] != span[i]), shorter)
    if same == 0:
        raise TrackMismatch(f"the echo tokenized the completion another way from its first token ({span[:1]})")
    return _compare(kept, cand.span(start), range(same), range(same), TEACHER_FORCED)


def shared_prefix(inc: TokenTrack, cand: TokenTrack, greedy: bool) -> TokenAgreement:
    """Compare two generations where their contexts were the same (up to the first differing token).

    Where a server sent no alternatives, a greedy request's token is its top-1.
    """
    if greedy:
        inc = TokenTrack(
            inc.tokens, inc.logprobs, tuple(t if t is not None else inc.tokens[i] for i, t in enumerate(inc.top1))
        )
        cand = TokenTrack(
            cand.tokens, cand.logprobs, tuple(t if t is not None else cand.tokens[i] for i, t in enumerate(cand.top1))
        )
    shortest = min(len(inc.tokens), len(cand.tokens))
    parted = next((i for i in range(shortest) if inc.tokens[i] != cand.tokens[i]), shortest)
    compared = range(min(parted + 1, shortest))
    return _compare(inc, cand, compared, range(parted), SHARED_PREFIX)
