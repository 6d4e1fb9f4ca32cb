"""tandem.model: load a Llama-family model from a Hugging Face directory and run its forward pass."""

from tandem.model.config import SUPPORTED_ARCHITECTURES, ModelConfig, load_config
from tandem.model.errors import ModelLoadError
from tandem.model.forward_batch import ForwardBatch
from tandem.model.loader import Model, default_model_dir, load_model
from tandem.model.tokenizer import ChatTemplateError, IncrementalDetokenizer, Tokenizer
from tandem.model.transformer import KVCache, Transformer

__all__ = [
    "ForwardBatch",
    "ChatTemplateError",
    "IncrementalDetokenizer",
    "KVCache",
    "Model",
    "ModelConfig",
    "ModelLoadError",
    "SUPPORTED_ARCHITECTURES",
    "Tokenizer",
    "Transformer",
    "default_model_dir",
    "load_config",
    "load_model",
]
