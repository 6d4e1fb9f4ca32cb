"""tandem.zoo: builds the bundled models (tokenizer, target, distilled draft) from the Python stdlib.

Names load lazily: `tandem --help` imports the zoo's CLI, which must not pull in torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tandem.lazy import lazy_exports

if TYPE_CHECKING:  # the exports, each loaded on first use (tandem.lazy)
    from tandem.zoo.build import DRAFT_DIR_NAME, TARGET_DIR_NAME, BuildConfig, build_models
    from tandem.zoo.corpus import Corpus, load_corpus
    from tandem.zoo.distill import distill
    from tandem.zoo.evaluate import HeldoutScore, model_score, top1_agreement, unigram_score
    from tandem.zoo.presets import preset_config
    from tandem.zoo.sample import SAMPLE_FILE_NAME, load_sample
    from tandem.zoo.shapes import ModelShape, matmul_flops_per_token
    from tandem.zoo.tokenizer import train_tokenizer
    from tandem.zoo.train import pretrain

__getattr__, __dir__, __all__ = lazy_exports(__name__, __file__)
