"""Model cards (README.md) for the bundled models, rendered from the build report."""

from __future__ import annotations

from typing import Any

__all__ = ["render_card"]

PURPOSE = {
    "target": "the default model of tandem: what `tandem generate` and the library load when no model "
    "is named, and the target model of speculative decoding.",
    "draft": "the draft model of speculative decoding for `tandem-code-target`: it proposes tokens "
    "that the target then verifies in one pass. It shares the target's tokenizer.",
}


OPTIMIZER_TEXT = {
    "muon": "Muon (`torch.optim.Muon`, RMS matched to AdamW) for the transformer's matrices, AdamW "
    "(betas 0.9/0.95, {scale}x the learning rate) for the tied embedding and the norms",
    "adamw": "AdamW (betas 0.9/0.95)",
}


def _millions(n: int) -> str:
    return f"{n / 1e6:.2f}M"


def _architecture(model: dict[str, Any], config: dict[str, Any]) -> list[str]:
    shape = model["shape"]
    return [
        "| | |",
        "|---|---|",
        "| architecture | `LlamaForCausalLM` (RMSNorm, RoPE, grouped-query attention, SwiGLU) |",
        f"| parameters | {_millions(model['parameters'])} (embeddings tied with the output head) |",
        f"| layers / hidden / intermediate | {shape['num_layers']} / {shape['hidden_size']} / "
        f"{shape['intermediate_size']} |",
        f"| attention heads / key-value heads | {shape['num_heads']} / {shape['num_kv_heads']} |",
        f"| vocabulary | {config['vocab_size']} (byte-level BPE, `<s>`=0, `</s>`=1, `<pad>`=2) |",
        f"| context | {config['seq_len']} tokens (the training length; `max_position_embeddings`) |",
        "| weights | bfloat16, `model.safetensors` |",
        f"| FLOPs per token | {_millions(model['flops_per_token'])} (weight matmuls incl. lm_head); "
        f"{_millions(model['flops_per_token_at_context'])} with attention over "
        f"{config['seq_len']} tokens of context |",
    ]


def _evaluation(report: dict[str, Any]) -> list[str]:
    corpus, agreement = report["corpus"], report["agreement"]
    lines = [
        f"On the {corpus['heldout_files']} held-out files ({corpus['heldout_bytes']:,} bytes, "
        f"{report['target']['heldout']['tokens']:,} predicted tokens), scored from the shipped bf16 weights "
        "run in float32; every row is scored on the same tokens:",
        "",
        "| model | loss (nats/token) | perplexity | bits per byte |",
        "|---|---|---|---|",
    ]
    for name in ("target", "draft", "unigram"):
        score = report[name] if name == "unigram" else report[name]["heldout"]
        label = {
            "target": "tandem-code-target",
            "draft": "tandem-code-draft",
            "unigram": "unigram baseline (train-split token frequencies, add-one smoothed)",
        }[name]
        lines.append(f"| {label} | {score['loss']:.3f} | {score['perplexity']:.2f} | {score['bits_per_byte']:.3f} |")
    lines += [
        "",
        "Draft top-1 agreement with the target (how often the draft's most likely next token is the "
        "target's, teacher-forced at every position; the per-token acceptance rate of greedy "
        f"speculative decoding): **{agreement['heldout']:.1%}** on all held-out files, "
        f"**{agreement['sample']:.1%}** on the committed sample `src/tandem/data/models/{agreement['sample_file']}` "
        f"({agreement['sample_tokens']:,} tokens; the sample that `tests/zoo` checks).",
        "",
        f"Draft / target FLOPs per token: **{report['flop_ratio']:.3f}** (weight matmuls), "
        f"{report['flop_ratio_at_context']:.3f} with attention at full context.",
    ]
    return lines


def _data(report: dict[str, Any]) -> list[str]:
    corpus = report["corpus"]
    heldout = ", ".join(f"`{p}`" for p in corpus["heldout_paths"])
    if corpus["is_stdlib"]:
        source = (
            f"The Python standard library source of CPython {report['environment']['python']} "
            "(`Lib/**/*.py`, sorted by path)"
        )
    else:
        source = f"The Python files under `{corpus['root']}` (sorted by path)"
    return [
        f"{source}, without test directories (`test/`, `tests/`, `idle_test/`), `site-packages/`, "
        "the build-specific `_sysconfigdata*` and `config-*/`, and the gencodec-generated charmap "
        "tables in `encodings/` (data, not code).",
        "",
        f"- train: {corpus['train_files']} files, {corpus['train_bytes']:,} bytes, {corpus['train_tokens']:,} tokens",
        f"- held out (a file is held out when the SHA-256 of its relative path, read as a fraction, is "
        f"below {report['config']['heldout_fraction']}): {corpus['heldout_files']} files, "
        f"{corpus['heldout_bytes']:,} bytes: {heldout}",
        f"- held-out file list SHA-256 (names joined by newlines): `{corpus['heldout_list_sha256']}`",
        f"- corpus content SHA-256 (every path and text): `{corpus['content_sha256']}`",
        "",
        "The Python standard library is Copyright (c) 2001-2023 Python Software Foundation and is "
        "distributed under the PSF License Agreement; the committed held-out sample quotes excerpts of "
        f"these files: {', '.join(f'`{p}`' for p in report['agreement']['sample_files'])}.",
    ]


def _training(report: dict[str, Any], role: str) -> list[str]:
    model, config = report[role], report["config"]
    optimizer = OPTIMIZER_TEXT[config["optimizer"]].format(scale=config.get("adamw_lr_scale", 1))
    lines = [
        f"- {model['steps']:,} optimizer steps: {optimizer}; weight decay 0.1 "
        "on matrices, gradient clip 1.0, "
        f"peak learning rate {model['peak_lr']}, {config['warmup_steps']}-step warmup then cosine to 10%",
        f"- batches of {config['batch_size']} x {config['seq_len']} tokens ({config['tokens_per_step']:,} "
        f"tokens per step): {model['tokens_seen']:,} tokens seen",
        f"- bf16 autocast on CPU ({report['environment']['machine']}), "
        f"torch {report['environment']['torch']}; "
        f"{model['train_seconds'] / 60:.1f} minutes; final training loss {model['final_train_loss']:.3f}",
        f"- seed {config['seed']}; batch order and weight init are seeded, so the build is reproducible",
    ]
    if role == "target":
        lines.insert(0, f"- next-token prediction from scratch, {model['epochs']} epochs of the train split")
    else:
        d = model["distillation"]
        lines.insert(
            0,
            "- distilled from the shipped (bf16) `tandem-code-target`: cross-entropy against the target's "
            f"next-token distribution at temperature {d['temperature']} "
            "(the gradient of KL(target || draft)) "
            f"with {d['hard_label_weight']} of the mass on the true next token, on the train split",
        )
    return lines


def render_card(report: dict[str, Any], role: str) -> str:
    name = f"tandem-code-{role}"
    lines = [
        "---",
        "license: apache-2.0",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags: [code, python, tandem, speculative-decoding]",
        "---",
        "",
        f"# {name}",
        "",
        f"A small Python code model trained on a 2-core CPU; {PURPOSE[role]} It completes Python the way the "
        "standard library is written; it is a test and demo model, not an assistant: it has no instruction "
        "or chat training and knows only what the standard library's source shows.",
        "",
        "## Model",
        "",
        *_architecture(report[role], report["config"]),
        "",
        "## Training data",
        "",
        *_data(report),
        "",
        "## Training",
        "",
        *_training(report, role),
        "",
        "## Evaluation",
        "",
        *_evaluation(report),
        "",
        "## Build",
        "",
        f"Built by the command below in {report['build_seconds'] / 60:.1f} minutes of wall time "
        f"({report['build_cpu_seconds'] / 60:.1f} CPU-minutes over {report['environment']['machine']}; "
        "both models, evaluation included); the full report is `src/tandem/data/models/tandem-code-build.json`.",
        "",
        "```",
        report["command"],
        "```",
        "",
    ]
    return "\n".join(lines)
