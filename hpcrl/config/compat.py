"""The NeMo RL compatibility table (``docs/nemo-rl-compat.md``), generated from the code.

Rows: every key NeMo RL's base configs set in a supported release (the NeMo RL key registry,
``hpcrl.config.nemo_rl_keys``) and every NeMo RL key hpcrl decides on by name. Each row's
status comes from where the value goes, never from the schema alone:

- implemented: a schema field with the code sites that act on its value
  (``hpcrl.config.consumers.CONSUMED_BY``; ``tests/core/test_consumers_downstream.py`` sets
  each one to another value and checks that what those sites build changes);
- accepted: cannot change results (``consumers.NOT_CONSUMED``, ``foreign_keys``, sections
  NeMo RL reads only under a setting hpcrl refuses by name: ``nemo_rl_filter``);
- accepted only while off (the rule or the entry that refuses any other value);
- accepted at NeMo RL's default only (a key NeMo RL knows and hpcrl does not use: any other
  value is refused, ``nemo_rl_filter``);
- rejected (a section of an algorithm hpcrl does not train).

    python -m hpcrl.config.compat        # rewrite docs/nemo-rl-compat.md

``tests/config/test_compat.py`` fails when the committed table differs from this.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import attrs

from hpcrl.config.aliases import ALIASES, rename_path
from hpcrl.config.consumers import CONSUMED_BY
from hpcrl.config.foreign_key_entry import WILDCARD
from hpcrl.config.foreign_key_table import FOREIGN_KEYS, UNSUPPORTED_SECTIONS
from hpcrl.config.foreign_keys import find_foreign_key, known_schema_paths
from hpcrl.config.not_consumed import NOT_CONSUMED
from hpcrl.config.recipe import Recipe
from hpcrl.config.shared_methods import SharedMethods

REPO = Path(__file__).resolve().parents[2]
TABLE_FILE = REPO / "docs" / "nemo-rl-compat.md"

IMPLEMENTED = "implemented"
INERT = "accepted: cannot change results"
OFF_ONLY = "accepted only while off"
DEFAULT_ONLY = "accepted at NeMo RL's default only"
SECTION = "section"
REJECTED = "rejected"
UNDECLARED = "schema field with no declared consumer"
UNKNOWN = "unknown key: an error today"

#: schema fields that hold free-form mappings: a key below one is its field's
FREE_FORM = (
    "policy.megatron_cfg.env_vars",
    "policy.automodel_cfg.env_vars",
    "policy.hf_config_overrides",
    "policy.tokenizer.chat_template_kwargs",
    "policy.generation.vllm_cfg.env_vars",
    "policy.megatron_cfg.model_overrides",
    "policy.optimizer.kwargs",
    "policy.generation.vllm_kwargs",
    "env.kwargs",
)


@attrs.frozen
class Row(SharedMethods):
    key: str  # NeMo RL's spelling
    status: str
    note: str


def _schema() -> frozenset[str]:
    return known_schema_paths(Recipe)


def classify(nemo_path: str) -> tuple[str, str]:
    """(status, note) of one NeMo RL key path."""
    parts = rename_path(tuple(nemo_path.split(".")))
    path = ".".join(parts)
    renamed = f"read as `{path}`; " if path != nemo_path else ""
    for section, reason in UNSUPPORTED_SECTIONS.items():
        if path == section or path.startswith(section + "."):
            return REJECTED, reason
    above = next((field for field in FREE_FORM if path.startswith(field + ".")), None)
    if above is not None:
        status, note = classify_schema_field(above)
        return status, f"{renamed}a key of `{above}`: {note}"
    if path in _schema():
        status, note = classify_schema_field(path)
        return status, (renamed + note).removesuffix("; ")
    return _outside_schema(parts)


def classify_schema_field(path: str) -> tuple[str, str]:
    if path in NOT_CONSUMED:
        entry = NOT_CONSUMED[path]
        if entry.status == "inert":
            return INERT, entry.reason
        return OFF_ONLY, f"off: {entry.off}; {entry.reason}"
    if path in CONSUMED_BY:
        return IMPLEMENTED, "read by " + ", ".join(f"`{site}`" for site in CONSUMED_BY[path])
    if any(other.startswith(path + ".") for other in _schema()):
        return SECTION, "a section: each key below it has its own row"
    return UNDECLARED, ""


def _outside_schema(parts: tuple[str, ...]) -> tuple[str, str]:
    from hpcrl.config.nemo_rl_filter import (
        READ_ONLY_WHEN,
        env_reason,
        nemo_rl_parts,
        unread_section,
    )
    from hpcrl.config.nemo_rl_keys import registry

    entry = find_foreign_key(parts)
    if entry is not None:
        if entry.status == "inert":
            return INERT, entry.reason
        return OFF_ONLY, f"off: {entry.off_text() or 'enabled: false'}; {entry.reason}"
    unread = unread_section(parts)
    if unread is not None and unread.read_with_backend is None:
        return INERT, unread.reason
    if parts[0] == "env" and len(parts) >= 2:
        return INERT, env_reason(parts[1])
    path = ".".join(parts)
    switched = next((entry for entry in READ_ONLY_WHEN if entry.path == path), None)
    if switched is not None:
        return INERT, f"read by NeMo RL only with {switched.when}: true"
    known = registry().lookup(nemo_rl_parts(parts))
    if known is None:
        return UNKNOWN, ""
    if known.section:
        return SECTION, "a section: each key below it has its own row"
    defaults = known.defaults_text()
    if not defaults:
        return DEFAULT_ONLY, "NeMo RL gives it no default; any value is refused"
    return DEFAULT_ONLY, f"NeMo RL's default: {defaults}; any other value is refused"


def table_keys() -> list[str]:
    """The NeMo RL keys the table lists (NeMo RL's spelling)."""
    from hpcrl.config.nemo_rl_filter import nemo_rl_parts
    from hpcrl.config.nemo_rl_keys import registry

    keys = set(registry().base_config_keys())
    known = registry()
    for path in [*CONSUMED_BY, *NOT_CONSUMED]:
        nemo_parts = nemo_rl_parts(tuple(path.split(".")))
        found = known.lookup(nemo_parts)
        if found is not None and found.path == ".".join(nemo_parts):
            keys.add(found.path)
    for entry in FOREIGN_KEYS:
        if WILDCARD not in entry.path:
            keys.add(".".join(nemo_rl_parts(tuple(entry.path.split(".")))))
    return sorted(keys)


def nemo_rl_rows() -> list[Row]:
    return [Row(key, *classify(key)) for key in table_keys()]


def render_table(rows: list[Row]) -> str:
    from hpcrl.config.nemo_rl_keys import SUPPORTED_RELEASES

    counts: dict[str, int] = {}
    for row in rows:
        counts[row.status] = counts.get(row.status, 0) + 1
    lines = [
        "# NeMo RL config keys in hpcrl",
        "",
        "Generated by `python -m hpcrl.config.compat` from the code; do not edit by hand.",
        f"NeMo RL releases whose configs hpcrl reads: {', '.join(SUPPORTED_RELEASES)} (the key",
        "registry in `hpcrl/config/nemo_rl_releases/`, built from each release's example",
        "configs and config classes by `python -m hpcrl.config.nemo_rl_keys_build`).",
        "Rows: every key NeMo RL's base configs (grpo_math_1B, sft and their Megatron",
        "variants) set in one of them, and every NeMo RL key hpcrl decides on by name.",
        "",
        "An **implemented** key names the code that acts on its value (`hpcrl/config/consumers.py`;",
        "`tests/core/test_consumers_downstream.py` changes each one and checks that what that",
        "code builds changes). A key **accepted at NeMo RL's default only** is one hpcrl does not",
        "use: at the default `hpcrl validate` counts it in one line (`--verbose` lists them),",
        "any other value is an error naming the key, the value and the default. A key NeMo RL",
        'does not know is an error with "did you mean".',
        f"`{'`, `'.join(ALIASES)}` is read as `{'`, `'.join(ALIASES.values())}` (the same",
        "section under its older name).",
        "",
        "| status | keys |",
        "|---|---|",
        *(f"| {status} | {count} |" for status, count in sorted(counts.items())),
        "",
        "| key | status | why |",
        "|---|---|---|",
        *(f"| `{row.key}` | {row.status} | {_cell(row.note)} |" for row in rows),
        "",
    ]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    TABLE_FILE.write_text(render_table(nemo_rl_rows()), encoding="utf-8")
    print(f"wrote {TABLE_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
