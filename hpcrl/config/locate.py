"""Where recipes and cluster profiles are found, by path or by name.

Profiles: ``$HPCRL_CLUSTER_PROFILES`` (folders separated by ``os.pathsep``), then the user's
``~/.config/hpcrl/cluster_profiles/`` (``$XDG_CONFIG_HOME`` honoured), then the profiles
shipped inside hpcrl. The first folder holding ``<name>.yaml`` wins, so a site overrides a
shipped profile without editing hpcrl. Recipes: a path, or the name of a shipped recipe.
"""

from __future__ import annotations

import importlib.util
import os
import stat
from collections.abc import Mapping
from pathlib import Path

from hpcrl.config.errors import ConfigError, Problem
from hpcrl.config.suggestions import did_you_mean

PROFILES_ENV_VAR = "HPCRL_CLUSTER_PROFILES"
YAML_SUFFIXES = (".yaml", ".yml")


def shipped_recipes_dir() -> Path:
    return shipped_package_dir("hpcrl.recipes")


def shipped_profiles_dir() -> Path:
    return shipped_package_dir("hpcrl.cluster_profiles")


def user_profiles_dir(environ: Mapping[str, str] | None = None) -> Path:
    environ = os.environ if environ is None else environ
    config_home = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "hpcrl" / "cluster_profiles"


def profile_search_path(environ: Mapping[str, str] | None = None) -> list[Path]:
    """Folders searched for ``<name>.yaml``, first wins."""
    environ = os.environ if environ is None else environ
    site_dirs = [
        Path(entry).expanduser()
        for entry in environ.get(PROFILES_ENV_VAR, "").split(os.pathsep)
        if entry
    ]
    return [*site_dirs, user_profiles_dir(environ), shipped_profiles_dir()]


def list_profiles(environ: Mapping[str, str] | None = None) -> dict[str, Path]:
    """Every profile name on the search path and the file that wins for it, sorted by name."""
    found: dict[str, Path] = {}
    for folder in profile_search_path(environ):
        for name, path in _yaml_files(folder).items():
            found.setdefault(name, path)
    return dict(sorted(found.items()))


def list_recipes() -> dict[str, Path]:
    """Shipped recipes (not the bases under ``recipes/base/``) by name, sorted."""
    return _yaml_files(shipped_recipes_dir())


def find_profile(name_or_path: str | os.PathLike, environ: Mapping[str, str] | None = None) -> Path:
    """The profile file for a name on the search path or an explicit path."""
    path = _as_existing_path(name_or_path, "--cluster")
    if path is not None:
        return path
    name = _without_yaml_suffix(str(name_or_path))
    for folder in profile_search_path(environ):
        for suffix in YAML_SUFFIXES:
            candidate = folder / f"{name}{suffix}"
            if candidate.is_file():
                return candidate
    _refuse_non_file(Path(name_or_path).expanduser(), str(name_or_path), "--cluster")
    searched = ", ".join(str(folder) for folder in profile_search_path(environ))
    raise ConfigError(
        [_not_found("--cluster", name, list_profiles(environ), f"searched: {searched}", "profile")]
    )


def find_recipe(name_or_path: str | os.PathLike) -> Path:
    """The recipe file for a path or the name of a shipped recipe."""
    path = _as_existing_path(name_or_path, "recipe")
    if path is not None:
        return path
    name = _without_yaml_suffix(str(name_or_path))
    for suffix in ("", *YAML_SUFFIXES):
        candidate = shipped_recipes_dir() / f"{name}{suffix}"
        if candidate.is_file():
            return candidate
    _refuse_non_file(Path(os.fspath(name_or_path)).expanduser(), str(name_or_path), "recipe")
    where = f"no file {os.fspath(name_or_path)!r} here and no shipped recipe of that name in {shipped_recipes_dir()}"
    raise ConfigError([_not_found("recipe", name, list_recipes(), where, "recipe")])


def _not_found(
    path: str, name: str, available: Mapping[str, Path], where: str, what: str
) -> Problem:
    guess = did_you_mean(name, available)
    names = ", ".join(available) or "none"
    fix = (f"did you mean {guess}? " if guess else "") + f"available {what}s: {names}"
    if what == "profile":
        fix += f"; a site adds its own as <folder>/{name}.yaml with {PROFILES_ENV_VAR}=<folder>"
    return Problem(path=path, value=name, message=f"{what} not found ({where})", fix=fix)


def _as_existing_path(name_or_path: str | os.PathLike, what: str) -> Path | None:
    path = Path(os.fspath(name_or_path)).expanduser()
    if path.is_file():
        return path.absolute()
    if str(name_or_path) == "":
        raise ConfigError(
            [Problem(path=what, value="", message="empty", fix=f"give a {what} name or file")]
        )
    if _is_plain_name(str(name_or_path)):
        return None  # a name: searched for by the caller
    _refuse_non_file(path, str(name_or_path), what)
    nearby = _yaml_files(path.parent)
    guess = did_you_mean(path.stem, nearby)
    fix = (
        f"did you mean {nearby[guess]}?"
        if guess
        else f"check the path; {what} files there: {', '.join(nearby) or 'none'}"
    )
    problem = Problem(path=what, value=str(name_or_path), message="no such file", fix=fix)
    raise ConfigError([problem])


def _refuse_non_file(path: Path, given: str, what: str) -> None:
    """A folder or a device where a YAML file was expected is said so, not "no such file"."""
    if path.is_dir():
        inside = ", ".join(str(p) for p in _yaml_files(path).values())
        fix = f"give one file: {inside}" if inside else "give a YAML file"
        raise ConfigError(
            [Problem(path=what, value=given, message="a folder, not a file", fix=fix)]
        )
    kind = non_file_kind(path)
    if kind is not None:
        message = f"{kind}, not a YAML file"
        raise ConfigError(
            [Problem(path=what, value=given, message=message, fix="give a YAML file")]
        )


def non_file_kind(path: Path) -> str | None:
    """What ``path`` is when it exists but is not a regular file ("a character device", ...);
    None for a regular file or nothing at all."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return None
    kinds = (
        (stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
    )  # fmt: skip
    return next((kind for is_kind, kind in kinds if is_kind(mode)), None)


def _without_yaml_suffix(name: str) -> str:
    for suffix in YAML_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _is_plain_name(text: str) -> bool:
    # "grpo-tiny-1n-cpu.yaml" may name a shipped recipe; "a/b.yaml" is always a path.
    return os.sep not in text and "/" not in text


def _yaml_files(folder: Path) -> dict[str, Path]:
    if not folder.is_dir():
        return {}
    files = [path for path in folder.iterdir() if path.suffix in YAML_SUFFIXES and path.is_file()]
    return {path.stem: path for path in sorted(files)}


def shipped_templates_dir() -> Path:
    return shipped_package_dir("hpcrl.templates")


def shipped_package_dir(package: str) -> Path:
    """The folder of a shipped package (``hpcrl.recipes``, ``.cluster_profiles``, ``.templates``).

    An installed hpcrl (wheel or editable) maps these names to folders. A bare source checkout
    on ``sys.path`` (``PYTHONPATH=checkout``, or ``python`` run from the checkout's root, which
    shadows an installed hpcrl) has no mapping: the folders then sit beside the package, at the
    checkout's root.
    """
    # The package's spec, not importlib.resources.files: same folder, without importing
    # importlib.resources, zipfile and tempfile at every command's start-up (~5 ms here).
    spec = importlib.util.find_spec(package)
    if spec is None:
        import hpcrl

        folder = Path(hpcrl.__file__).resolve().parent.parent / package.rpartition(".")[2]
        if not (folder / "__init__.py").is_file():
            raise ModuleNotFoundError(f"No module named {package!r}", name=package)
        return folder
    locations = list(spec.submodule_search_locations or ())
    assert locations and Path(locations[0]).is_dir(), (
        f"{package} must be installed as files, not zipped: {spec.origin}"
    )
    return Path(locations[0])
