"""Where the files NeMo RL's data sections name are: prompt templates, system prompts and
local data sets, made absolute at load time (the job reads the resolved recipe from its run
folder, so a relative path would mean something else there).

NeMo RL resolves these against its working directory, its repository root
(``examples/prompts/cot.txt`` from ``examples/configs/grpo_math_1B.yaml``). hpcrl looks in
the recipe's folder, then each folder above it, then the current directory; the first that
holds the file wins. A path found nowhere stays as written: the data rules report it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SECTION_FILE_KEYS = ("data_path", "prompt_file", "system_prompt_file")
FLAT_FILE_KEYS = ("prompt_file", "system_prompt_file")
SECTIONS = ("train", "validation", "default")


def locate(value: str, recipe_dir: Path) -> str:
    """The absolute path of ``value`` by the search order above, or ``value`` unchanged."""
    candidate = Path(value).expanduser()
    if candidate.is_absolute():
        return str(candidate)
    for folder in (recipe_dir, *recipe_dir.parents, Path.cwd()):
        found = folder / candidate
        if found.exists():
            return str(found.resolve())
    return value


def absolutize_data_files(data: dict[str, Any], recipe_dir: Path) -> None:
    """In place: every file key of ``data`` (the recipe's ``data`` section) made absolute."""
    targets: list[tuple[dict[str, Any], tuple[str, ...]]] = [(data, FLAT_FILE_KEYS)]
    for name in SECTIONS:
        section = data.get(name)
        for one in section if isinstance(section, list) else [section]:  # NeMo RL's lists
            if isinstance(one, dict):
                targets.append((one, SECTION_FILE_KEYS))
    for section, keys in targets:
        for key in keys:
            value = section.get(key)
            if isinstance(value, str) and value and "${" not in value:
                section[key] = locate(value, recipe_dir)
