"""`tandem zoo build`: corpus -> tokenizer -> target -> distilled draft -> evaluation -> HF directories.

Every stage is seeded and every list sorted, so the same command on the same machine builds the
same models. The evaluation runs on the exported bf16 weights, so the model cards describe exactly
what ships.
"""

from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from tandem.model.export import save_pretrained
from tandem.model.loader import load_model
from tandem.model.transformer import Transformer
from tandem.zoo.card import render_card
from tandem.zoo.corpus import load_corpus, stdlib_root
from tandem.zoo.distill import DistillConfig, distill
from tandem.zoo.evaluate import model_score, top1_agreement, unigram_counts, unigram_score
from tandem.zoo.sample import SAMPLE_FILE_NAME, heldout_sample, save_sample
from tandem.zoo.shapes import DRAFT_SHAPE, TARGET_SHAPE, ModelShape, matmul_flops_per_token, model_config
from tandem.zoo.tokenizer import save_tokenizer, special_token_ids, train_tokenizer
from tandem.zoo.tokens import WindowSampler, encode_files, eval_windows
from tandem.zoo.train import TrainConfig, TrainResult, pretrain

__all__ = ["BuildConfig", "build_models", "TARGET_DIR_NAME", "DRAFT_DIR_NAME", "REPORT_FILE_NAME"]

TARGET_DIR_NAME, DRAFT_DIR_NAME = "tandem-code-target", "tandem-code-draft"
REPORT_FILE_NAME = "tandem-code-build.json"


@dataclass(frozen=True)
class BuildConfig:
    vocab_size: int = 8192
    seq_len: int = 512  # training context; also the exported max_position_embeddings
    # 2048-token batches: at a fixed token budget, 240 steps of 4 windows beat 120 steps of 8
    # (held-out 5.05 against 5.15), for 5% less throughput.
    batch_size: int = 4
    target: ModelShape = TARGET_SHAPE
    draft: ModelShape = DRAFT_SHAPE
    # Calibrated on the 2-core build machine (target ~2400 tokens/s, distillation ~4300 tokens/s):
    # ~23 + ~10 minutes, ~36 in all, when other jobs leave it the two cores.
    target_steps: int = 1600
    draft_steps: int = 1200
    # From a sweep of 120-step runs of the target (held-out loss): Muon 2e-3 / 4e-3 / 8e-3 gave
    # 5.20 / 5.15 / 5.13, AdamW 1.5e-3 / 4e-3 gave 5.97 / 6.41; the tied embedding at 5x the rate
    # gave 5.04. The middle rate, since longer runs favour lower rates.
    target_lr: float = 4e-3
    draft_lr: float = 4e-3
    adamw_lr_scale: float = 5.0
    warmup_steps: int = 100
    optimizer: str = "muon"
    seed: int = 0
    heldout_fraction: float = 0.02
    corpus_root: Path | None = None  # None: the running interpreter's stdlib
    sample_bytes: int = 48_000
    distill: DistillConfig = field(default_factory=DistillConfig)
    threads: int = 2


def _shape_dict(shape: ModelShape) -> dict[str, int]:
    return asdict(shape)


def _model_report(module: Transformer, shape: ModelShape, result: TrainResult, lr: float, seq_len: int) -> dict:
    config = module.config
    return {
        "shape": _shape_dict(shape),
        "parameters": config.num_parameters,
        "flops_per_token": matmul_flops_per_token(config),
        "flops_per_token_at_context": matmul_flops_per_token(config, seq_len),
        "steps": result.steps,
        "tokens_seen": result.tokens_seen,
        "train_seconds": round(result.seconds, 1),
        "final_train_loss": round(result.final_loss, 4),
        "peak_lr": lr,
    }


def _score_dict(score, num_bytes: int) -> dict[str, float]:
    return {
        "tokens": score.tokens,
        "loss": round(score.loss, 4),
        "perplexity": round(score.perplexity, 3),
        "bits_per_byte": round(score.bits_per_byte(num_bytes), 4),
    }


def build_models(out: Path, config: BuildConfig, command: str, console: Console | None = None) -> dict[str, Any]:
    """Build the target and draft into out/ and return the build report (also written as JSON)."""
    console = console or Console(stderr=True)
    started, started_cpu = time.monotonic(), time.process_time()
    torch.set_num_threads(config.threads)
    out = Path(out)
    target_dir, draft_dir = out / TARGET_DIR_NAME, out / DRAFT_DIR_NAME

    corpus = load_corpus(config.corpus_root, config.heldout_fraction)
    console.print(
        f"corpus {corpus.root}: {len(corpus.train)} train files ({corpus.num_bytes('train'):,} bytes), "
        f"{len(corpus.heldout)} held out ({corpus.num_bytes('heldout'):,} bytes)"
    )
    tokenizer = train_tokenizer((f.text for f in corpus.train), config.vocab_size)
    ids = special_token_ids(tokenizer)
    vocab = tokenizer.get_vocab_size()
    train_stream = encode_files(tokenizer, corpus.train, ids["bos"], ids["eos"])
    heldout_stream = encode_files(tokenizer, corpus.heldout, ids["bos"], ids["eos"])
    heldout = eval_windows(heldout_stream, config.seq_len)
    console.print(f"tokenizer: {vocab} tokens; {len(train_stream):,} train tokens, {len(heldout_stream):,} held out")

    def new_module(shape: ModelShape) -> Transformer:
        return Transformer(model_config(shape, vocab, config.seq_len, ids["bos"], ids["eos"]))

    def train_config(steps: int, lr: float, seed: int) -> TrainConfig:
        warmup = min(config.warmup_steps, steps)
        return TrainConfig(
            steps=steps,
            lr=lr,
            warmup_steps=warmup,
            optimizer=config.optimizer,
            adamw_lr_scale=config.adamw_lr_scale,
            seed=seed,
        )

    # Target: next-token pretraining, then export (bf16) and reload, so the draft learns from the
    # very weights that ship.
    torch.manual_seed(config.seed)
    target = new_module(config.target)
    sampler = WindowSampler(train_stream, config.seq_len, config.batch_size, seed=config.seed)
    target_result = pretrain(target, sampler, train_config(config.target_steps, config.target_lr, config.seed), console)
    target_report = _model_report(target, config.target, target_result, config.target_lr, config.seq_len)
    target_report["epochs"] = round(target_result.tokens_seen / len(train_stream), 2)
    _export(target, target_dir, tokenizer, config.seq_len, ids["pad"])
    shipped_target = load_model(target_dir).module

    draft = new_module(config.draft)
    sampler = WindowSampler(train_stream, config.seq_len, config.batch_size, seed=config.seed + 1)
    draft_train = train_config(config.draft_steps, config.draft_lr, config.seed + 1)
    draft_result = distill(draft, shipped_target, sampler, draft_train, config.distill, console)
    draft_report = _model_report(draft, config.draft, draft_result, config.draft_lr, config.seq_len)
    draft_report["distillation"] = asdict(config.distill)
    _export(draft, draft_dir, tokenizer, config.seq_len, ids["pad"])
    shipped_draft = load_model(draft_dir).module

    console.print("evaluating the exported models on held-out files")
    heldout_bytes = corpus.num_bytes("heldout")
    counts = unigram_counts(train_stream, vocab)
    target_report["heldout"] = _score_dict(model_score(shipped_target, heldout), heldout_bytes)
    draft_report["heldout"] = _score_dict(model_score(shipped_draft, heldout), heldout_bytes)
    sample = heldout_sample(corpus.heldout, config.sample_bytes)
    save_sample(sample, out / SAMPLE_FILE_NAME, corpus.heldout_list_sha256)
    sample_windows = eval_windows(encode_files(tokenizer, sample, ids["bos"], ids["eos"]), config.seq_len)
    report: dict[str, Any] = {
        "command": command,
        "build_seconds": None,
        "build_cpu_seconds": None,
        "environment": {
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "machine": f"{platform.machine()}, {config.threads} threads",
        },
        "config": {
            "vocab_size": vocab,
            "seq_len": config.seq_len,
            "batch_size": config.batch_size,
            "tokens_per_step": config.batch_size * config.seq_len,
            "seed": config.seed,
            "heldout_fraction": config.heldout_fraction,
            "warmup_steps": config.warmup_steps,
            "optimizer": config.optimizer,
            "adamw_lr_scale": config.adamw_lr_scale,
        },
        "corpus": {
            "root": str(corpus.root),
            "is_stdlib": corpus.root == stdlib_root(),
            "train_files": len(corpus.train),
            "heldout_files": len(corpus.heldout),
            "train_bytes": corpus.num_bytes("train"),
            "heldout_bytes": heldout_bytes,
            "train_tokens": len(train_stream),
            "heldout_tokens": len(heldout_stream),
            "heldout_paths": corpus.heldout_paths,
            "heldout_list_sha256": corpus.heldout_list_sha256,
            "content_sha256": corpus.content_sha256,
        },
        "target": target_report,
        "draft": draft_report,
        "unigram": _score_dict(unigram_score(counts, heldout), heldout_bytes),
        "flop_ratio": round(draft_report["flops_per_token"] / target_report["flops_per_token"], 4),
        "flop_ratio_at_context": round(
            draft_report["flops_per_token_at_context"] / target_report["flops_per_token_at_context"], 4
        ),
        "agreement": {
            "heldout": round(top1_agreement(shipped_target, shipped_draft, heldout), 4),
            "sample": round(top1_agreement(shipped_target, shipped_draft, sample_windows), 4),
            "sample_file": SAMPLE_FILE_NAME,
            "sample_files": [f.path for f in sample],
            "sample_tokens": sum(len(w) - 1 for w in sample_windows),
        },
    }
    report["build_seconds"] = round(time.monotonic() - started, 1)
    # CPU time of all threads: unlike wall time it does not count time the build waited for the
    # cores while other jobs ran (or while it was paused), so it is the comparable cost.
    report["build_cpu_seconds"] = round(time.process_time() - started_cpu, 1)
    (out / REPORT_FILE_NAME).write_text(json.dumps(report, indent=2) + "\n")
    (target_dir / "README.md").write_text(render_card(report, "target"))
    (draft_dir / "README.md").write_text(render_card(report, "draft"))
    _print_summary(report, console)
    return report


def _export(module: Transformer, out: Path, tokenizer, seq_len: int, pad_id: int) -> None:
    save_pretrained(module, out, dtype=torch.bfloat16, pad_token_id=pad_id)
    save_tokenizer(tokenizer, out, model_max_length=seq_len)


def _print_summary(report: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    table = Table(title="held-out evaluation (same tokens for every row)")
    for column in ("model", "loss (nats/token)", "perplexity", "bits/byte"):
        table.add_column(column)
    for name in ("target", "draft", "unigram"):
        score = report[name] if name == "unigram" else report[name]["heldout"]
        table.add_row(name, f"{score['loss']:.3f}", f"{score['perplexity']:.2f}", f"{score['bits_per_byte']:.3f}")
    console.print(table)
    agreement = report["agreement"]
    console.print(
        f"draft top-1 agreement with the target: {agreement['heldout']:.1%} (held-out), "
        f"{agreement['sample']:.1%} (committed sample); "
        f"draft/target FLOPs per token {report['flop_ratio']:.3f}; "
        f"build {report['build_seconds'] / 60:.1f} min"
    )
