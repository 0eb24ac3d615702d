"""The torch engine's compiled pieces, compiled ahead of time and kept in the compile cache
folder, so that a run's first call of a piece loads it instead of tracing it again.

Inductor's caches (FX graph, AOTAutograd, Triton) spare a warm run the kernels' compilation,
not dynamo's trace of the function, which under symbolic shapes was most of a warm first
GRPO step on the H200 (docs/performance.md, item 3). torch's ahead-of-time compilation
(``torch.compile(fn).aot_compile``, ``torch.compiler.load_compiled_function``) saves the
traced, compiled function with its guards: loading it traces nothing. Each file holds one
compilation of one piece, named by the piece, a digest of what it was compiled from (torch's
and Triton's versions, the GPU, the source files of the piece's module and of the hpcrl
functions it calls) and of its arguments' kinds (tensors' dtype, rank, device; plain
values' repr). A loaded compilation runs a call only when its guards (dynamo's, saved with it)
accept the arguments; a call that none accepts goes through torch.compile as before.

Only with Inductor (the backend whose output serialises) and a compile cache folder
(``TORCHINDUCTOR_CACHE_DIR``: hpcrl's jobs set it, ``hpcrl.plan.compile_cache``); anything
failing here (a torch without the API, a file from a crashed writer) costs a warning and
the ordinary compilation, never the call.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
import types
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

AOT_SUBDIR = "hpcrl-aot"  # under TORCHINDUCTOR_CACHE_DIR, beside Inductor's own entries
CACHE_DIR_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"
#: Set by hpcrl's job script beside the folder (``compile_cache.compile_cache_env``), never by
#: torch, which exports ``TORCHINDUCTOR_CACHE_DIR`` itself (its default folder, for its compile
#: workers) once Inductor has run: that alone must not switch this on in any process.
PLANNED_VARIABLE = "TORCHINDUCTOR_FX_GRAPH_CACHE"
#: This process's ahead-of-time compilations, all pieces together: what the metrics line
#: carries beside Inductor's cache hits (``hpcrl.core.compile_stats``). A rejection is a kept
#: compilation whose guards refused the call it was kept for (counted once per kind of call,
#: its reason in the worker's log): the call then compiled as if nothing were kept.
TALLY: dict[str, int] = {"aot_loads": 0, "aot_builds": 0, "aot_guard_rejections": 0}


@attrs.define
class PrecompiledPieces:
    """The ahead-of-time compilations of one piece in this process (loaded or built)."""

    fn: Callable[..., Any]
    folder: Path
    source_digest: str
    traced: Callable[..., Any]  # fn with the modules its code imports among its globals
    ready: list[Any] = attrs.field(factory=list)
    signatures_tried: set[str] = attrs.field(factory=set)
    loads: int = 0  # compilations read from the folder
    loaded_paths: set[Path] = attrs.field(factory=set)  # in ``ready`` already
    by_path: dict[Path, Any] = attrs.field(factory=dict)  # the ``ready`` ones, by their file
    rejections: list[str] = attrs.field(factory=list)  # why a kept one refused its own kind
    #: Preloaded compilations' building calls, as the index names them: (grad mode, shape
    #: of the call's first tensor), or None for lines written before they were recorded.
    kept_calls: dict[Path, tuple[bool, tuple[int, ...]] | None] = attrs.field(factory=dict)
    builds: int = 0  # compilations made here and written there
    failures: list[str] = attrs.field(factory=list)
    #: What names one compilation's file (besides the source digest): the arguments' kinds.
    signature_of: Callable[[Sequence[Any]], str] = attrs.field(factory=lambda: _arguments_signature)
    #: Called with the arguments just before a build traces them (``compiled_piece``'s marks).
    before_build: Callable[[Sequence[Any]], None] | None = None

    @classmethod
    def for_piece(cls, fn: Callable[..., Any], backend: Any) -> PrecompiledPieces | None:
        """None when nothing can be kept: another backend, no compile cache folder planned
        (both variables, as hpcrl's jobs set them), or a torch without ahead-of-time
        compilation."""
        import torch

        folder = os.environ.get(CACHE_DIR_VARIABLE)
        planned = os.environ.get(PLANNED_VARIABLE) == "1"
        if backend != "inductor" or not folder or not planned:
            return None
        if not hasattr(torch.compiler, "load_compiled_function"):
            return None
        return cls(
            fn=fn,
            folder=Path(folder) / AOT_SUBDIR,
            source_digest=_source_digest(fn),
            traced=_with_modules_in_globals(fn),
        )

    def matching(self, args: Sequence[Any]) -> Callable[..., Any] | None:
        """The compilation whose guards accept ``args``: one already here, else the one
        saved for their signature (built and saved now when there is none); None when no
        compilation takes them (then the caller compiles as usual)."""
        for compiled in self.ready:
            if compiled.guard_check(*args):
                return compiled
        signature = self.signature_of(args)
        if signature in self.signatures_tried:
            return None
        self.signatures_tried.add(signature)
        path = self.path_for(signature)
        kept = self.by_path.get(path)
        if kept is not None:  # preloaded for this very kind of call, and it refuses the call
            self._record_rejection(kept, path, args)
            return None
        compiled = self._load_or_build(signature, args)
        if compiled is None:
            return None
        self._add_ready(compiled, path)
        if compiled.guard_check(*args):
            return compiled
        self._record_rejection(compiled, path, args)
        return None

    def _add_ready(self, compiled: Any, path: Path) -> None:
        self.ready.append(compiled)
        self.by_path[path] = compiled

    def _record_rejection(self, compiled: Any, path: Path, args: Sequence[Any]) -> None:
        """Why ``compiled``'s guards refuse ``args`` (dynamo's failing guard, as
        ``check_verbose`` words it), kept and written to the log once per kind of call:
        a kept compilation that refuses the calls it was made for compiles them again,
        and nothing else would say which guard did it."""
        try:
            f_locals = compiled.prepare_f_locals(*args)
            verbose = compiled._artifacts.guard_manager.check_verbose(f_locals)
            parts = [str(part) for part in verbose.verbose_code_parts]
            false = _false_relations(parts, f_locals)
            reason = "; ".join(parts)
            if false:
                reason = f"false: {'; '.join(false)} | the guard's relations: {reason}"
        except Exception as error:  # a torch without these internals: the count still tells
            reason = f"(reason unavailable: {type(error).__name__}: {error})"
        self.rejections.append(f"{path.name}: {reason}")
        TALLY["aot_guard_rejections"] += 1
        warnings.warn(
            f"{self.fn.__name__}: the kept compilation {path.name} refuses the call it was "
            f"kept for; compiling it again. Failing guard: {reason[:600]}",
            stacklevel=3,
        )

    def path_for(self, signature: str) -> Path:
        digest = hashlib.sha256(f"{self.source_digest}\n{signature}".encode()).hexdigest()
        return self.folder / f"{self.fn.__name__}-{digest[:32]}.bin"

    @property
    def index_path(self) -> Path:
        """The files this source's compilations were saved in (one name a line): what a
        later process loads before its first call (``preload``)."""
        # "calls": lines name their building call (``IndexEntry``); an index of an earlier
        # format is not read, so its compilations load at their first call, which records it
        return self.folder / f"{self.fn.__name__}-{self.source_digest[:32]}.calls.index"

    def preload(self) -> int:
        """Load every compilation an earlier run of the same source saved (its index), so
        the first call only checks guards: loading one (deserialising its graphs, building
        its guards) took ~0.1-0.3 s on a GPU, in the first GRPO step. Returns how many.

        Each is loaded under the autocast its calls ran under when it was kept (the index
        says): dynamo's tensor guards take the thread's dispatch keys as they are while the
        guards are built, autocast's among them, so guards built outside the autocast of a
        bf16 block's calls refuse every one of them ("dispatch key set mismatch": the
        blocks compiled again, 11.9 s, in a warm H200 run that preloaded them in setup)."""
        try:
            lines = self.index_path.read_text().splitlines()
        except OSError:
            return 0
        entries = {entry.name: entry for entry in map(IndexEntry.parse, lines) if entry.name}
        loaded = 0
        for name, entry in entries.items():
            path = self.folder / name
            if path.suffix != ".bin" or path in self.loaded_paths or not path.exists():
                continue
            with _autocast_as_kept(entry.autocast):
                compiled = self._load_saved(path)
            if compiled is not None:
                self._add_ready(compiled, path)
                self.kept_calls[path] = entry.call
                loaded += 1
        return loaded

    def _load_saved(self, path: Path) -> Any:
        import torch

        try:
            with torch._dynamo.config.patch(enable_aot_compile=True):
                compiled = self._read(path)
            compiled.disable_guard_check()  # checked by matching, once per call
        except Exception:  # a torn file, say: the first call tries it again and reports it
            return None
        self.loads += 1
        TALLY["aot_loads"] += 1
        self.loaded_paths.add(path)
        return compiled

    def _read(self, path: Path) -> Any:
        import torch

        with path.open("rb") as saved:
            return torch.compiler.load_compiled_function(saved, f_globals=self.traced.__globals__)

    def _remember(self, path: Path, args: Sequence[Any]) -> None:
        """Add ``path`` to the index (appended: ranks and runs share the folder), with the
        autocast of the call that loaded or built it (``preload`` loads it under it), its
        grad mode and its first tensor's shape (a warm-up can then make a call its guards
        take: ``first_calls``)."""
        self.loaded_paths.add(path)
        try:
            known = self.index_path.read_text().split() if self.index_path.exists() else []
            if path.name not in known:
                with self.index_path.open("a") as index:
                    index.write(" ".join([path.name, *_autocast_now(), *_call_now(args)]) + "\n")
        except OSError:  # a read-only cache: later runs load at their first call instead
            pass

    def _load_or_build(self, signature: str, args: Sequence[Any]) -> Any:
        import torch

        path = self.path_for(signature)
        if path in self.loaded_paths:  # preloaded, and its guards reject these arguments
            return None
        refused = path.with_suffix(".failed")
        if refused.exists():  # a build failed here before: don't pay its trace in every run
            self.failures.append(f"an earlier build failed: {refused.read_text()[:200]}")
            return None
        building = not path.exists()
        # torch 2.11 attaches aot_compile to torch.compile's result only with this flag
        # (its default there is off; 2.13's is on)
        try:
            with torch._dynamo.config.patch(enable_aot_compile=True):
                if path.exists():
                    compiled = self._read(path)
                    self.loads += 1
                    TALLY["aot_loads"] += 1
                else:
                    if self.before_build is not None:
                        self.before_build(args)
                    compiled = self._build(args)
                    _save(compiled, path)
                    self.builds += 1
                    TALLY["aot_builds"] += 1
            compiled.disable_guard_check()  # checked by matching, once per call
            compiled.guard_check  # noqa: B018  (a torch without it fails here, not in a call)
            self._remember(path, args)
        except Exception as error:  # any failure costs the ordinary compilation only
            self.failures.append(f"{type(error).__name__}: {error}")
            if building:  # the same source, torch and arguments would fail again
                _write_refusal(refused, f"{type(error).__name__}: {error}")
            warnings.warn(
                f"{self.fn.__name__}: no ahead-of-time compilation in {self.folder} "
                f"({type(error).__name__}: {str(error)[:200]}); compiling it in every run",
                stacklevel=4,
            )
            return None
        return compiled

    def _build(self, args: Sequence[Any]) -> Any:
        """``aot_compile`` cannot restart a trace: a float argument that dynamo first traces
        as a symbol and then restarts to specialise (``TensorifyScalarRestartAnalysis``, the
        sampler's temperature on CPU) is specialised from the start on a second try (its
        value is in the file's name already)."""
        import torch

        def compile_once() -> Any:
            compiled = torch.compile(self.traced, dynamic=True, fullgraph=True)
            return compiled.aot_compile((tuple(args), {}))

        try:
            return compile_once()
        except Exception as error:
            if type(error).__name__ != "TensorifyScalarRestartAnalysis":
                raise
        with torch._dynamo.config.patch(specialize_float=True):
            return compile_once()


def _autocast_now() -> list[str]:
    """The autocast this thread runs under, one ``autocast:<device>:<dtype>`` a device."""
    import torch

    return [
        f"autocast:{device}:{str(torch.get_autocast_dtype(device)).removeprefix('torch.')}"
        for device in ("cpu", "cuda")
        if torch.is_autocast_enabled(device)
    ]


def _call_now(args: Sequence[Any]) -> list[str]:
    """``grad:<0|1>`` and ``shape:<d0>x<d1>...`` of the first tensor among ``args``."""
    import torch
    from torch.utils._pytree import tree_leaves

    first = next((leaf for leaf in tree_leaves(list(args)) if isinstance(leaf, torch.Tensor)), None)
    if first is None:
        return []
    shape = "x".join(str(size) for size in first.shape)
    return [f"grad:{int(torch.is_grad_enabled())}", f"shape:{shape}"]


@attrs.frozen
class IndexEntry:
    """An index line: the file's name, then the autocast it was kept under and its building
    call's grad mode and first tensor's shape (lines written before either was recorded
    have none: they load as they always did)."""

    name: str
    autocast: tuple[str, ...]
    call: tuple[bool, tuple[int, ...]] | None

    @classmethod
    def parse(cls, line: str) -> IndexEntry:
        name, *tokens = line.split() or [""]
        values = dict(token.split(":", 1) for token in tokens if ":" in token)
        call = None
        if values.get("grad") in ("0", "1") and values.get("shape", "").replace("x", "").isdigit():
            shape = tuple(int(size) for size in values["shape"].split("x"))
            call = (values["grad"] == "1", shape)
        autocast = tuple(token for token in tokens if token.startswith("autocast:"))
        return cls(name, autocast, call)


def _autocast_as_kept(states: Sequence[str]) -> contextlib.ExitStack:
    """The autocast contexts an index entry names, entered by the caller."""
    import torch

    stack = contextlib.ExitStack()
    for state in states:
        _, device, dtype_name = state.split(":")
        dtype = getattr(torch, dtype_name, None)
        if isinstance(dtype, torch.dtype):
            stack.enter_context(torch.autocast(device, dtype))
    return stack


def _with_modules_in_globals(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` (same code) whose globals also hold ``torch`` and ``torch.nn.functional``.

    The pieces import torch inside their bodies (hpcrl's modules import it lazily); dynamo's
    output then names the module by a global made from its ``id()`` in the compiling
    process, which no later process has (torch 2.13: "Missing required external
    references: ['___module_torch_<id>_c0']"). Found among the function's globals under its
    own name, the module is named ``torch`` (``functional``) instead, which the loading
    process passes back in."""
    import torch
    import torch.nn.functional

    scope = {**fn.__globals__, "torch": torch, "functional": torch.nn.functional}
    copy = types.FunctionType(fn.__code__, scope, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    copy.__module__ = fn.__module__
    return copy


def _save(compiled: Any, path: Path) -> None:
    """Written under a temporary name, then renamed: concurrent runs share the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        compiled.save_compiled_function(str(temporary))
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def _false_relations(parts: Sequence[str], f_locals: dict[str, Any]) -> list[str]:
    """The relations of a refusing guard that are false for these arguments. A shape guard
    lists every relation it checks, true or not (stride and size relations, Inductor's size
    limits, 0/1 specialisations), each a Python expression over ``L`` before a ``#`` comment:
    evaluated here on the call's arguments, so the log names the one that refused."""
    false = []
    for part in parts:
        expression = part.split("  #", 1)[0].strip()
        try:  # dynamo's own guard text, over the call's own arguments
            holds = eval(expression, {"__builtins__": {}}, {"L": f_locals})  # noqa: S307
        except Exception:  # not a plain expression (a tensor-match message, say)
            continue
        if holds is False:
            false.append(part)
    return false


def _write_refusal(path: Path, reason: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(reason)
    except OSError:  # a read-only cache: the build is only tried again
        pass


def _arguments_signature(args: Sequence[Any]) -> str:
    import torch

    parts = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            parts.append(f"T{arg.dtype}/{arg.dim()}/{arg.device.type}/{arg.requires_grad}")
        else:
            parts.append(f"{type(arg).__name__}={arg!r}")
    return ",".join(parts)


def _source_digest(fn: Callable[..., Any]) -> str:
    """torch's and Triton's versions, the GPU, the source of ``fn``'s module and of the
    hpcrl modules whose functions it can call."""
    import torch

    hasher = hashlib.sha256(f"torch {torch.__version__}".encode())
    try:
        import triton

        hasher.update(f" triton {triton.__version__}".encode())
    except ImportError:
        pass
    if torch.cuda.is_available():
        hasher.update(
            f" {torch.cuda.get_device_name()} {torch.cuda.get_device_capability()}".encode()
        )
    files = {inspect.getsourcefile(fn)}
    for value in fn.__globals__.values():
        if inspect.isfunction(value) and value.__module__.startswith("hpcrl."):
            files.add(inspect.getsourcefile(value))
    for name in sorted(f for f in files if f):
        hasher.update(Path(name).read_bytes())
    return hasher.hexdigest()
