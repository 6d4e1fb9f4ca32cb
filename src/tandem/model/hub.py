"""resolve_model: what `--model` names -> a local Hugging Face model directory.

`--model` takes what every peer takes (vLLM, SGLang, TGI, llama.cpp's `-hf`):
- a directory on disk (used as it is);
- a Hugging Face id, `org/name` or `org/name@revision` (a branch, tag or commit), resolved through
  `huggingface_hub`: its cache (`HF_HOME` / `HF_HUB_CACHE`), `HF_HUB_OFFLINE=1` (cache only, no
  network), and the token from the environment (`HF_TOKEN`). Only safetensors weights, configs,
  tokenizer files and chat templates are fetched, never pickles: unpickling runs arbitrary code;
- nothing: the bundled default model.

Torch-free, so the CLI can check a model name before anything heavy loads.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tandem.data.bundled import bundled_model_dir
from tandem.model.errors import ModelLoadError

__all__ = [
    "ResolvedModel",
    "resolve_model",
    "parse_hub_id",
    "HUB_FILE_PATTERNS",
]

# What a replica needs from a repository; weights as safetensors only.
HUB_FILE_PATTERNS = (
    "*.safetensors",
    "*.safetensors.index.json",
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
)
_PICKLES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
_HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+?)(?:@(?P<revision>[\w./-]+))?$")


@dataclass(frozen=True)
class ResolvedModel:
    path: Path  # a local directory holding config.json, weights, tokenizer
    name: str  # what clients call it: the hub id, or the directory's name
    source: str  # "local" | "hub" | "bundled"
    revision: str | None = None


def parse_hub_id(spec: str) -> tuple[str, str | None] | None:
    """('org/name', revision or None) for a Hugging Face id, None for anything else."""
    match = _HUB_ID.match(spec)
    if match is None or spec.startswith((".", "/", "~")):
        return None
    return match["repo"], match["revision"]


def _offline_from_env() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _download(repo_id: str, revision: str | None, offline: bool, cache_dir: str | Path | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{repo_id}@{revision}" if revision else repo_id
    try:
        return Path(
            snapshot_download(
                repo_id,
                revision=revision,
                allow_patterns=list(HUB_FILE_PATTERNS),
                local_files_only=offline,
                cache_dir=cache_dir,
            )
        )
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE is set" if offline else "the hub could not be reached"
        raise ModelLoadError(
            f"{where}: not in the local Hugging Face cache and {why}; download it once with network access "
            "(or give a model directory)"
        ) from None
    except GatedRepoError:
        raise ModelLoadError(f"{where}: a gated repository; accept its licence on the hub and set HF_TOKEN") from None
    except RevisionNotFoundError:
        raise ModelLoadError(f"{where}: no such revision on the Hugging Face hub") from None
    except RepositoryNotFoundError:
        raise ModelLoadError(
            f"{where}: no such model directory, and no such repository on the Hugging Face hub "
            "(or it is private: set HF_TOKEN)"
        ) from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise ModelLoadError(f"{where}: cannot fetch from the Hugging Face hub ({exc})") from None


def _check_snapshot(path: Path, where: str) -> None:
    names = {p.name for p in path.iterdir()}
    if not any(n.endswith(".safetensors") for n in names):
        pickles = sorted(n for n in names if n.endswith(_PICKLES))
        found = f" (it has {', '.join(pickles)})" if pickles else ""
        raise ModelLoadError(
            f"{where}: the repository has no safetensors weights{found}; tandem loads safetensors only, "
            "because unpickling can run arbitrary code"
        )
    if "config.json" not in names:
        raise ModelLoadError(f"{where}: the repository has no config.json")


def resolve_model(
    spec: str | Path | None,
    *,
    offline: bool | None = None,
    cache_dir: str | Path | None = None,
    download: Callable[[str, str | None, bool, str | Path | None], Path] | None = None,
) -> ResolvedModel:
    """A local directory for `spec` (see the module docstring). Raises ModelLoadError naming the problem."""
    if spec is None:
        return ResolvedModel(bundled_model_dir(), bundled_model_dir().name, "bundled")
    text = str(spec)
    local = Path(text).expanduser()
    if local.exists():
        if not local.is_dir():
            raise ModelLoadError(f"{local}: not a directory (give the model's directory, or a Hugging Face id)")
        return ResolvedModel(local, local.name, "local")
    hub = parse_hub_id(text)
    if hub is None:
        raise ModelLoadError(f"{text}: model directory does not exist (nor is it a Hugging Face id, org/name)")
    repo_id, revision = hub
    where = f"{repo_id}@{revision}" if revision else repo_id
    path = (download or _download)(repo_id, revision, _offline_from_env() if offline is None else offline, cache_dir)
    _check_snapshot(path, where)
    return ResolvedModel(path, repo_id, "hub", revision)
