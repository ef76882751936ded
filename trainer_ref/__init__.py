"""Reference Ling MoE trainer (arXiv 2503.05139): the model in :mod:`trainer_ref.model`.

Names are resolved lazily, so that ``python -m trainer_ref.model`` and importing sibling modules do not
import the model (and torch) first.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer_ref.model import PRESETS, LingMoE, ModelConfig, ModelOutput, MoEAux, ParamCount, count_parameters

__all__ = ["PRESETS", "LingMoE", "ModelConfig", "ModelOutput", "MoEAux", "ParamCount", "count_parameters"]

_LAZY = {name: "trainer_ref.model" for name in __all__}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
