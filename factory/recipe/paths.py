"""Where recipe files are, and the paths inside a recipe made absolute once, at load.

Why once: a path in a recipe is relative to the recipe's folder (``pipelines/airline.yaml``
says ``../seeds/airline/seeds.jsonl`` and works from any working directory), and the
code that reads a pack, a prompt or a seed file must not need the recipe to know where
it is. ``resolve_paths`` rewrites every path field of a loaded recipe to an absolute path
(a ``factory:`` name to the file the factory ships), remembering what was written
(``RecipeBase.as_written``). A URI (``s3://...``) is left as it is. ``output.dir``,
``cache.path`` and ``seeds.hf_dataset`` are relative to the working directory (or a
dataset id), as their descriptions say, and stay as written.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from factory import packs
from factory.errors import ConfigError
from factory.recipe.section import Section
from factory.recipe.types import RecipeBase

__all__ = ["resolve_paths", "resolve_recipe_path"]

#: The domain section's fields that name files of its pack.
DOMAIN_FILES = ("tools", "policy", "rules", "grammar", "compose")


def _path_fields(cfg: RecipeBase) -> Iterator[tuple[tuple[str | int, ...], Section, str]]:
    """(location, section, field) of every field of ``cfg`` that holds recipe paths."""
    domains: list[tuple[tuple[str | int, ...], Section]] = [(("domain",), cfg.domain)]
    seeds: list[tuple[tuple[str | int, ...], Section | None]] = [(("seeds",), cfg.seeds)]
    for i, part in enumerate(cfg.parts or []):
        domains.append((("parts", i, "domain"), part.domain))
        seeds.append((("parts", i, "seeds"), part.seeds))
    for loc, domain in domains:
        for name in DOMAIN_FILES:
            yield loc, domain, name
    for loc, section in seeds:
        if section is not None:
            yield loc, section, "path"
    yield ("prefilter",), cfg.prefilter, "prompt"
    if cfg.amplify is not None:
        yield ("amplify",), cfg.amplify, "prompt"
        if cfg.amplify.grounding is not None:
            yield ("amplify", "grounding"), cfg.amplify.grounding, "prompt"
    if cfg.mixture is not None:
        yield ("mixture",), cfg.mixture, "path"
    if cfg.near_duplicates is not None:
        yield ("near_duplicates",), cfg.near_duplicates, "index"
    if cfg.decontamination is not None:
        yield ("decontamination",), cfg.decontamination, "benchmark"


def _is_uri(text: str) -> bool:
    """A filesystem URI (``s3://``): read where it is (``factory.io.objectstore.is_uri``)."""
    return "://" in text and not text.startswith("file://")


def resolve_paths(cfg: RecipeBase, base_dir: Path) -> None:
    """Make every path field of ``cfg`` absolute against ``base_dir`` (the recipe's
    folder), in place, and remember each value as written (``as_written``).

    Raises:
        ConfigError: a ``factory:`` name outside the shipped folders (its key path).
    """
    cfg._base_dir = base_dir

    def one(text: str, key: str) -> str:
        if _is_uri(text):
            return text
        try:
            return str(cfg.resolve(text))
        except ConfigError as exc:
            raise ConfigError(str(exc), key_path=key) from exc
        except (ValueError, OSError) as exc:  # a NUL byte, a name too long for the system
            raise ConfigError(f"not a usable path: {text!r} ({exc})", key_path=key) from exc

    for loc, section, name in _path_fields(cfg):
        value = getattr(section, name)
        if value is None:
            continue
        key = ".".join(str(s) for s in (*loc, name))
        new: Any = [one(v, key) for v in value] if isinstance(value, list) else one(value, key)
        if new != value:
            setattr(section, name, new)
            cfg._written.append(((*loc, name), value, new))


def resolve_recipe_path(name: str | Path, cwd: Path | None = None) -> Path:
    """Find a recipe: the path as given, else ``pipelines/NAME`` (with or without .yaml)
    in the working directory, else the recipe of that name the factory ships.

    Why: ``ray job submit -- python -m factory.run airline.yaml`` is run from the
    repository root, where the file lives under ``pipelines/``; with the package
    installed (a cluster image, no ``--working-dir``) it runs from any folder.
    ``factory:pipelines/NAME.yaml`` names a shipped recipe explicitly.

    Raises:
        ConfigError: no such file; the message lists each place tried once and names
            the nearest recipe found there (``airlin.yaml``: did you mean airline.yaml?).
    """
    cwd = cwd or Path.cwd()
    folders: list[Path] = []
    if packs.is_shipped(str(name)):
        candidates = [packs.resolve(str(name))]
        folders.append(candidates[0].parent)
    else:
        given = Path(name)
        candidates = [given if given.is_absolute() else cwd / given]
        if not given.is_absolute() and len(given.parts) == 1:
            yaml_suffix = given.suffix in (".yaml", ".yml")
            stems = (given.name,) if yaml_suffix else (given.name, f"{given.name}.yaml")
            folders += [cwd / "pipelines", packs.folder("pipelines")]
            candidates += [folder / stem for folder in folders for stem in stems]
    for cand in candidates:
        if cand.is_file():
            return cand.resolve()
    # The shipped folder is the working folder's pipelines/ in a checkout: name each once.
    tried = ", ".join(dict.fromkeys(str(c.resolve()) for c in candidates))
    raise ConfigError(
        f"recipe not found (tried {tried}){_nearest_recipe(Path(name).name, folders)}",
        key_path="recipe",
    )


def _nearest_recipe(name: str, folders: list[Path]) -> str:
    """``; did you mean airline.yaml?`` (the closest recipe file name in ``folders``), or
    the recipes there when none is close, or "" when the folders hold none."""
    known = sorted({p.stem for f in folders if f.is_dir() for p in f.glob("*.yaml")})
    if not known:
        return ""
    wanted = Path(name).stem if name.endswith((".yaml", ".yml")) else name
    close = difflib.get_close_matches(wanted, known, n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]}.yaml?"
    return f"; recipes there: {', '.join(f'{k}.yaml' for k in known)}"
