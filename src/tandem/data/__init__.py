"""Data tandem needs at run time, shipped as package data with its licence and attribution (NOTICE.md);
the bundled models' locators are in bundled.py.

`data_path(name)` finds a bundled file; `ATTRIBUTION[name]` is the line any report quoting results
computed from it must carry. Standard library only: the scheduling side and the simulator use it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

__all__ = ["ATTRIBUTION", "CONVERSATION_TRACE", "SPLITWISE_TIMINGS", "data_path"]

CONVERSATION_TRACE = "azure_llm_conv_2023.csv"
SPLITWISE_TIMINGS = "splitwise_perf_model.csv"

ATTRIBUTION = {
    CONVERSATION_TRACE: (
        "Azure LLM inference trace (conversation, 2023), Azure/AzurePublicDataset, CC-BY 4.0; "
        'Patel et al., "Splitwise: Efficient generative LLM inference using phase splitting", ISCA 2024'
    ),
    SPLITWISE_TIMINGS: (
        "Splitwise GPU timings (perf_model.csv), Mutinifni/splitwise-sim, MIT License, "
        "Copyright (c) 2024 Pratyush Patel"
    ),
}


def data_path(name: str) -> Path:
    """The bundled file `name` (a real path: the package is installed from a directory or a wheel)."""
    if name not in ATTRIBUTION:
        raise ValueError(f"no bundled data file {name!r} (bundled: {', '.join(sorted(ATTRIBUTION))})")
    path = Path(str(resources.files(__name__).joinpath(name)))
    if not path.is_file():
        raise FileNotFoundError(f"{path}: bundled data file missing (reinstall tandem)")
    return path
