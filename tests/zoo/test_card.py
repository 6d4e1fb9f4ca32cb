"""Model cards carry the numbers the issue asks for: data, steps, tokens, losses, agreement, command."""

from tandem.zoo.card import render_card

REPORT = {
    "command": "tandem zoo build --out models/",
    "build_seconds": 2400.0,
    "build_cpu_seconds": 4200.0,
    "environment": {"python": "3.11.7", "torch": "2.13.0", "machine": "x86_64, 2 threads"},
    "config": {
        "vocab_size": 8192,
        "seq_len": 512,
        "batch_size": 8,
        "tokens_per_step": 4096,
        "seed": 0,
        "heldout_fraction": 0.02,
        "warmup_steps": 50,
        "optimizer": "muon",
    },
    "corpus": {
        "root": "/usr/lib/python3.11",
        "is_stdlib": True,
        "train_files": 644,
        "heldout_files": 13,
        "train_bytes": 10_000_000,
        "heldout_bytes": 100_000,
        "train_tokens": 2_700_000,
        "heldout_tokens": 27_000,
        "heldout_paths": ["chunk.py", "sched.py"],
        "heldout_list_sha256": "f" * 64,
        "content_sha256": "e" * 64,
    },
    "target": {
        "shape": {
            "hidden_size": 384,
            "num_layers": 8,
            "num_heads": 6,
            "num_kv_heads": 2,
            "intermediate_size": 1024,
        },
        "parameters": 15_700_000,
        "flops_per_token": 31_500_000,
        "flops_per_token_at_context": 37_800_000,
        "steps": 640,
        "tokens_seen": 2_621_440,
        "train_seconds": 1500.0,
        "final_train_loss": 1.9,
        "peak_lr": 0.0015,
        "epochs": 0.97,
        "heldout": {"tokens": 26_890, "loss": 1.5, "perplexity": 4.48, "bits_per_byte": 0.55},
    },
    "draft": {
        "shape": {
            "hidden_size": 128,
            "num_layers": 3,
            "num_heads": 2,
            "num_kv_heads": 1,
            "intermediate_size": 384,
        },
        "parameters": 1_600_000,
        "flops_per_token": 3_280_000,
        "flops_per_token_at_context": 4_070_000,
        "steps": 640,
        "tokens_seen": 2_621_440,
        "train_seconds": 600.0,
        "final_train_loss": 2.5,
        "peak_lr": 0.003,
        "distillation": {"temperature": 1.0, "hard_label_weight": 0.1},
        "heldout": {"tokens": 26_890, "loss": 2.1, "perplexity": 8.17, "bits_per_byte": 0.77},
    },
    "unigram": {"tokens": 26_890, "loss": 6.1, "perplexity": 445.86, "bits_per_byte": 2.2},
    "flop_ratio": 0.104,
    "flop_ratio_at_context": 0.108,
    "agreement": {
        "heldout": 0.712,
        "sample": 0.705,
        "sample_file": "tandem-code-heldout-sample.json",
        "sample_files": ["chunk.py"],
        "sample_tokens": 12_000,
    },
}


def test_target_card_states_data_training_and_evaluation():
    card = render_card(REPORT, "target")
    assert card.startswith("---\nlicense: apache-2.0") and "# tandem-code-target" in card
    for expected in (
        "CPython 3.11.7",
        "644 files",
        "`chunk.py`, `sched.py`",
        "f" * 64,
        "Python Software Foundation",
        "640 optimizer steps: Muon",
        "2,621,440 tokens seen",
        "| tandem-code-target | 1.500 | 4.48 | 0.550 |",
        "| 445.86 |",
        "**71.2%**",
        "**70.5%**",
        "**0.104**",
        "15.70M",
        "512 tokens",
        "tandem zoo build --out models/",
        "40.0 minutes of wall time (70.0 CPU-minutes",
    ):
        assert expected in card, expected


def test_draft_card_describes_distillation():
    card = render_card(REPORT, "draft")
    assert "# tandem-code-draft" in card and "distilled from the shipped (bf16) `tandem-code-target`" in card
    assert "0.1 of the mass on the true next token" in card and "1.60M" in card
