"""NeMo RL keys outside hpcrl's schema: taken out of a recipe before it is structured, each
either accepted as unused (NeMo RL's default or off value, or a key that cannot change
results) or refused with its path, value, reason and fix.

Three sources decide, in this order:

1. ``hpcrl.config.foreign_keys``: hpcrl's own decision per key, with its reason (a key that
   cannot change results, or one accepted only while off);
2. ``UNREAD_SECTIONS`` below: sections NeMo RL itself reads only under a setting hpcrl
   refuses by name (another generation backend, an environment no data set names);
3. the NeMo RL key registry (``hpcrl.config.nemo_rl_keys``): a key NeMo RL knows, at one of
   its defaults or off, is unused here; at any other value it would change what NeMo RL does,
   which hpcrl does not implement: refused. A key NeMo RL does not know either is an
   "unknown key" error with "did you mean" over hpcrl's and NeMo RL's keys of its section.

Loading the registry costs a few milliseconds: it happens only when a recipe holds a key
that neither the schema nor ``foreign_keys`` knows.
"""

from __future__ import annotations

import copy
import functools
import typing
from collections.abc import Mapping
from typing import Any

import attrs

from hpcrl.config.converter import PathParts, keys_outside_schema
from hpcrl.config.errors import NO_VALUE, Problem
from hpcrl.config.foreign_keys import TakenOut, take_out_foreign_keys
from hpcrl.config.refusal_reasons import REGISTRY_FEATURES
from hpcrl.config.shared_methods import SharedMethods
from hpcrl.config.suggestions import did_you_mean

#: hpcrl's section names -> NeMo RL's (the registry speaks NeMo RL's; hpcrl.config.aliases)
NEMO_RL_NAMES = {("policy", "automodel_cfg"): ("policy", "dtensor_cfg")}


@attrs.frozen
class UnreadSection(SharedMethods):
    """A section NeMo RL reads only when ``when`` holds; hpcrl refuses that setting itself
    (``refused_by`` names where), so the section cannot change what hpcrl does."""

    path: str  # dotted
    reason: str
    #: the policy.generation.backend under which hpcrl reads the section (None: never)
    read_with_backend: str | None = None


UNREAD_SECTIONS = (
    UnreadSection(
        "policy.generation.sglang_cfg",
        "settings of NeMo RL's SGLang generation backend, read only when "
        "policy.generation.backend is sglang (hpcrl refuses that backend by name)",
    ),
    UnreadSection(
        "policy.generation.trtllm_cfg",
        "settings of NeMo RL's TensorRT-LLM generation backend, read only when "
        "policy.generation.backend is trtllm (hpcrl refuses that backend by name)",
    ),
    UnreadSection(
        "policy.generation.trtllm_kwargs",
        "extra arguments of NeMo RL's TensorRT-LLM generation backend, read only when "
        "policy.generation.backend is trtllm (hpcrl refuses that backend by name)",
    ),
    UnreadSection(
        "policy.generation.dynamo_cfg",
        "settings of NeMo RL's Dynamo generation backend, read only when "
        "policy.generation.backend is dynamo (hpcrl refuses that backend by name)",
    ),
    UnreadSection(
        "policy.generation.mcore_generation_config",
        "settings of NeMo RL's Megatron generation backend, read only when "
        "policy.generation.backend is megatron",
        read_with_backend="megatron",
    ),
)


#: NeMo RL's generation backends that hpcrl has no engine for: what each one is.
OTHER_BACKENDS = {
    "sglang": "NeMo RL's SGLang backend (SGLang inference servers, refitted from the policy "
    "and configured by policy.generation.sglang_cfg)",
    "trtllm": "NeMo RL's TensorRT-LLM backend (TensorRT-LLM engines with their own refit, "
    "configured by policy.generation.trtllm_cfg)",
    "dynamo": "NeMo RL's NVIDIA Dynamo backend (generation served by a Dynamo deployment, "
    "configured by policy.generation.dynamo_cfg)",
}


def _other_backend(name: str) -> Problem:
    return Problem(
        path="policy.generation.backend",
        value=name,
        message=f"{OTHER_BACKENDS[name]} is another inference engine; hpcrl generates with "
        "vLLM, the Megatron policy's own weights or its torch sampler, none of which is that "
        "engine, so it is not run under this name",
        fix="set policy.generation.backend=vllm (the same sampling settings: temperature, "
        f"top_p, top_k, stop strings; the {name}_cfg section is then unused) or torch",
    )


@attrs.frozen
class ReadOnlyWhen(SharedMethods):
    """A NeMo RL key that NeMo RL reads only while the switch ``when`` (a dotted path) is
    true: with the switch off it changes nothing whatever it holds."""

    path: str
    when: str


READ_ONLY_WHEN = (
    ReadOnlyWhen("grpo.async_grpo.max_generation_failures", "grpo.async_grpo.enabled"),
    # one dataloader per training set (NeMo RL's MultipleDataloaderWrapper) reads these
    ReadOnlyWhen("data.num_prompts_per_dataloader", "data.use_multiple_dataloader"),
    ReadOnlyWhen("data.custom_dataloader", "data.use_multiple_dataloader"),
)


@attrs.frozen
class UnusedKey(SharedMethods):
    """A NeMo RL key taken out of a recipe unrefused: its path (hpcrl's spelling), value and
    why it changes nothing. at_default: NeMo RL's default or off; else it cannot change
    results whatever it holds (``foreign_keys``' reason)."""

    path: str
    value: Any
    why: str
    at_default: bool = True


@attrs.frozen
class Judged(SharedMethods):
    kept: dict[str, Any]
    problems: list[Problem]
    unused: tuple[UnusedKey, ...]


def take_out_nemo_rl_keys(data: dict[str, Any], raw: Mapping[str, Any], schema: type) -> Judged:
    """``data`` without the keys its schema does not hold, with a problem for each refused
    one and a record of each accepted one. ``raw``: the same config as written (before
    interpolation), to recognise a default written as ``${...}``.

    The keys judged are those structuring finds outside the schema (``keys_outside_schema``:
    the converter reads every section anyway), taken in the order the recipe writes them; a
    section holding none is never looked at here."""
    kept = copy.deepcopy(data)  # the caller's dict is the resolved recipe: left whole
    switched_off = _take_out_switched_off(kept)
    problems: list[Problem] = []
    backend = _at(kept, ("policy", "generation", "backend"))
    if isinstance(backend, str) and backend in OTHER_BACKENDS:
        problems.append(_other_backend(backend))
        # the refusal says it all; the rest of the recipe is checked as if it named vLLM
        kept["policy"]["generation"]["backend"] = "vllm"
    judge = _Judge(raw=raw, problems=problems, unused=[], backend=backend)
    outside = _in_schema_sections(schema, keys_outside_schema(kept, schema))
    for parts, key, cls in _as_written(kept, outside):
        judge.outside(_at(kept, parts), parts, key, cls)
    # foreign_keys' decisions first, in its table's order (as that table reads)
    foreign = sorted(judge.foreign, key=lambda taken: taken.order)
    refused = [taken.refusal for taken in foreign if taken.refusal is not None]
    accepted = [
        UnusedKey(
            path=".".join(taken.parts),
            value=taken.value,
            why=taken.entry.reason
            if taken.entry.status == "inert"
            else f"off ({taken.entry.off_text()})",
            at_default=taken.entry.status != "inert",
        )
        for taken in foreign
        if taken.refusal is None
    ]
    return Judged(
        kept=kept,
        problems=refused + problems,
        unused=(*switched_off, *accepted, *judge.unused),
    )


def _in_schema_sections(
    schema: type, found: list[tuple[PathParts, Any]]
) -> list[tuple[tuple[str, ...], Any, type]]:
    """``found`` (section path, key) whose path is a chain of schema sections (not a list's
    items: structuring reports those), each with its section's class."""
    sections = []
    for parts, key in found:
        names = tuple(part for part in parts if isinstance(part, str))
        cls = _section_at(schema, names) if len(names) == len(parts) else None
        if cls is not None:
            sections.append((names, key, cls))
    return sections


def _as_written(
    data: dict[str, Any], found: list[tuple[tuple[str, ...], Any, type]]
) -> list[tuple[tuple[str, ...], Any, type]]:
    """``found`` in the order the recipe writes the keys: depth first, each section's keys
    in their order (the order problems were always listed in)."""

    def position(item: tuple[tuple[str, ...], Any, type]) -> list[int]:
        node: Any = data
        index = []
        for part in (*item[0], item[1]):
            index.append(list(node).index(part))
            node = node[part]
        return index

    return sorted(found, key=position)


def _section_at(schema: type, parts: tuple[str, ...]) -> type | None:
    """The schema section class at ``parts`` (None: not a chain of section fields)."""
    cls: type | None = schema
    for part in parts:
        if cls is None:
            return None
        cls = _section_fields(cls).get(part)
    return cls


@attrs.define
class _Judge:
    """Judges each key the schema does not hold where it stands: ``foreign_keys``' table,
    then the sections NeMo RL reads only under a setting hpcrl refuses, then NeMo RL's key
    registry; and takes it out."""

    raw: Mapping[str, Any]
    problems: list[Problem]
    unused: list[UnusedKey]
    backend: Any = None  # policy.generation.backend as written
    foreign: list[TakenOut] = attrs.field(factory=list)  # foreign_keys' decisions

    def outside(self, section: dict[str, Any], parts: tuple[str, ...], key: Any, cls: type) -> None:
        """The key ``key`` of the schema section ``section`` (at ``parts``, of class ``cls``)."""
        here = (*parts, str(key))
        taken, rest = take_out_foreign_keys(here, section[key])
        self.foreign += taken
        if rest is not NO_VALUE and not self.judge(here, rest):
            self.problems.append(_unknown_in_section(here, rest, cls))
        del section[key]

    def judge(self, parts: tuple[str, ...], value: Any) -> bool:
        """Decide one key outside the schema (accepted or refused); False when nobody knows
        it."""
        path = ".".join(parts)
        unread = unread_section(parts)
        if unread is not None and unread.read_with_backend != self.backend:
            self.unused.append(UnusedKey(path=path, value=value, why=unread.reason))
            return True
        if parts[0] == "env" and len(parts) == 2:
            self.unused.append(UnusedKey(path=path, value=value, why=env_reason(parts[1])))
            return True
        from hpcrl.config.nemo_rl_keys import registry

        known = registry().lookup(nemo_rl_parts(parts))
        if known is None:
            return False
        self.known_key(parts, value, known)
        return True

    def known_key(self, parts: tuple[str, ...], value: Any, known: Any) -> None:
        path = ".".join(parts)
        written = _at(self.raw, parts)
        if isinstance(value, Mapping) and value and not known.free_form:
            if value.get("enabled") is False:
                self.unused.append(UnusedKey(path=path, value=value, why="off (enabled: false)"))
                return
            if known.section and known.default_for(value, written) is None:
                self.section_below(parts, value)
                return
        default = known.default_for(value, written)
        if default is not None:
            why = f"NeMo RL's default, as in {default.source}"
            self.unused.append(UnusedKey(path=path, value=value, why=why))
        elif _is_off(value, known):
            self.unused.append(UnusedKey(path=path, value=value, why="not set (null or empty)"))
        else:
            self.problems.append(_refusal(path, value, known))

    def section_below(self, parts: tuple[str, ...], value: Mapping[str, Any]) -> None:
        """A section only NeMo RL knows: one refusal when its ``enabled`` switch turns on a
        feature, else each key judged on its own."""
        from hpcrl.config.nemo_rl_keys import registry

        switch = registry().lookup(nemo_rl_parts(parts + ("enabled",)))
        if value.get("enabled") is True and switch is not None and switch.default_for(True) is None:
            path = ".".join(parts + ("enabled",))
            self.problems.append(_refusal(path, True, switch, feature=".".join(parts)))
            return
        for key, item in value.items():
            here = parts + (str(key),)
            known = registry().lookup(nemo_rl_parts(here))
            if known is None:
                self.problems.append(
                    _unknown(here, item, registry().children(nemo_rl_parts(parts)))
                )
            else:
                self.known_key(here, item, known)


def _take_out_switched_off(data: dict[str, Any]) -> list[UnusedKey]:
    """``READ_ONLY_WHEN`` keys whose switch is off, taken out of ``data`` (in place)."""
    taken = []
    for entry in READ_ONLY_WHEN:
        parts = tuple(entry.path.split("."))
        parent = _at(data, parts[:-1])
        if not isinstance(parent, dict) or parts[-1] not in parent:
            continue
        if _at(data, tuple(entry.when.split("."))) is True:
            continue
        value = parent.pop(parts[-1])
        why = f"read by NeMo RL only with {entry.when}: true"
        taken.append(UnusedKey(path=entry.path, value=value, why=why))
    return taken


def nemo_rl_parts(parts: tuple[str, ...]) -> tuple[str, ...]:
    for ours, theirs in NEMO_RL_NAMES.items():
        if parts[: len(ours)] == ours:
            return theirs + parts[len(ours) :]
    return parts


def unread_section(parts: tuple[str, ...]) -> UnreadSection | None:
    dotted = ".".join(parts)
    for section in UNREAD_SECTIONS:
        if dotted == section.path or dotted.startswith(section.path + "."):
            return section
    return None


def env_reason(name: str) -> str:
    return (
        f"settings of NeMo RL's {name!r} environment, read only for data sets whose env_name "
        "names it (hpcrl's environment is math; data.*.env_name refuses any other by name)"
    )


def _is_off(value: Any, known: Any) -> bool:
    if value is None:
        return known.null_is_off
    return isinstance(value, Mapping | list) and not value


def _refusal(path: str, value: Any, known: Any, feature: str | None = None) -> Problem:
    defaults = known.defaults_text()
    what = f"NeMo RL's {feature or path}"
    if defaults:
        message = (
            f"{what} is not implemented by hpcrl; NeMo RL's default is {defaults}, and any "
            "other value changes what NeMo RL does, which hpcrl would not do"
        )
        fix = f"remove {path} or set it to {defaults} (NeMo RL's default)"
    else:
        message = f"{what} is not implemented by hpcrl, so this value would be ignored"
        fix = f"remove {path}" + (" or set it to null" if known.null_is_off else "")
    if path in REGISTRY_FEATURES:
        message = f"{message}: {REGISTRY_FEATURES[path]}"
    return Problem(path=path, value=value, message=message, fix=fix)


def _unknown(parts: tuple[str, ...], value: Any, siblings: list[str]) -> Problem:
    guess = did_you_mean(parts[-1], siblings)
    parent = ".".join(parts[:-1])
    fix = (
        f"did you mean {parent}.{guess}?"
        if guess
        else f"remove it; NeMo RL's keys under {parent}: {', '.join(siblings)}"
    )
    return Problem(
        path=".".join(parts),
        value=value,
        message=f"unknown key {parts[-1]!r} (neither hpcrl nor NeMo RL knows it)",
        fix=fix,
    )


def _unknown_in_section(parts: tuple[str, ...], value: Any, cls: type) -> Problem:
    """A key of a schema section neither hpcrl nor NeMo RL knows: the converter's message,
    with NeMo RL's keys of the section among the guesses (a typo of one is found too), then
    the section's keys further down that end with the name typed (policy.lr)."""
    from hpcrl.config.key_index import keys_ending_like
    from hpcrl.config.nemo_rl_keys import registry

    fields = list(_section_fields(cls))
    siblings = registry().children(nemo_rl_parts(parts[:-1]))
    guess = did_you_mean(parts[-1], [*fields, *siblings])
    parent = ".".join(parts[:-1]) or "the top level"
    below = [".".join((*parts[:-1], path)) for path in keys_ending_like(cls, (parts[-1],), 0)]
    if guess is not None:
        fix = f"did you mean {'.'.join((*parts[:-1], guess))}?"
    elif below:
        fix = f"did you mean {' or '.join(below)}?"
    else:
        fix = f"remove it; keys allowed under {parent}: {', '.join(fields)}"
    return Problem(path=".".join(parts), value=value, message=f"unknown key {parts[-1]!r}", fix=fix)


def _at(data: Any, parts: tuple[str, ...]) -> Any:
    for part in parts:
        if not isinstance(data, Mapping) or part not in data:
            return NO_VALUE
        data = data[part]
    return data


@functools.cache
def _section_fields(cls: type) -> dict[str, type | None]:
    """field name -> its section class (None for a leaf), cached per schema class."""
    from hpcrl.config.foreign_keys import _section_type

    hints = typing.get_type_hints(cls)
    return {field.name: _section_type(hints[field.name]) for field in attrs.fields(cls)}
