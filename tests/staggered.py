"""Continuous batching as a server sees it: requests arrive while others run."""

from __future__ import annotations


def run_staggered(engine, prompts, params, every: int = 2) -> list:
    """Submit request i (id str(i)) every `every` steps while the others run; final outputs in order."""
    final, submitted, step = {}, 0, 0
    while len(final) < len(prompts):
        if submitted < len(prompts) and step % every == 0:
            engine.add_request(prompts[submitted], params[submitted], request_id=str(submitted))
            submitted += 1
        for out in engine.step():
            if out.finished:
                final[int(out.request_id)] = out
        step += 1
    return [final[i] for i in range(len(prompts))]
