"""Loading a tokenizer the same way on both transformers lines (4.x and 5.x).

transformers 5 ignores a checkpoint's saved ``tokenizer_class: PreTrainedTokenizerFast`` for
some model types (qwen2 → ``Qwen2Tokenizer``, which re-derives its pre-tokenizer and drops
spaces from hpcrl's character-level tiny tokenizer). A folder that names the generic fast
class is loaded with that class directly; everything else goes through ``AutoTokenizer``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GENERIC_FAST_CLASS = "PreTrainedTokenizerFast"


def load_tokenizer(name_or_path: str) -> Any:
    """The tokenizer of a local folder or hub name, honouring a saved generic fast class."""
    config_path = Path(name_or_path) / "tokenizer_config.json"
    if config_path.is_file():
        saved_class = json.loads(config_path.read_text()).get("tokenizer_class")
        if saved_class == GENERIC_FAST_CLASS:
            from transformers import PreTrainedTokenizerFast

            return PreTrainedTokenizerFast.from_pretrained(name_or_path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name_or_path)
