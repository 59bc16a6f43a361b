"""The project's shipped data: recipes, prompt templates and domain packs, filters, seeds.

Why a package: ``pipelines/``, ``prompts/``, ``filters/`` and ``seeds/`` stay at the
repository root (the project's documented layout), and ``setup.py`` ships each one as a
subpackage of this one (``factory.packs.pipelines`` is ``pipelines/``, and so on). An
installed factory (``pip install .``, a cluster image without ``--working-dir``) therefore
has them, and an editable install reads the checkout's own folders. Code finds them
through :mod:`importlib.resources`, never through ``__file__``; the folders keep the same
relative layout, so a shipped recipe's ``../prompts/...`` resolves inside the package data.

A recipe names a shipped file by ``factory:<folder>/<path>`` (``factory:prompts/amplify.j2``),
whatever folder the recipe itself lives in (:func:`resolve`).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from factory.errors import ConfigError

__all__ = ["FOLDERS", "SCHEME", "folder", "is_shipped", "resolve", "shipped"]

#: The repository folders shipped as package data, by the name a shipped path starts with.
FOLDERS = ("pipelines", "prompts", "filters", "seeds")
#: The prefix of a recipe path that names a shipped file.
SCHEME = "factory:"


def folder(name: str) -> Path:
    """The shipped folder ``name`` (one of :data:`FOLDERS`) on the file system.

    Raises:
        ConfigError: an unknown folder, or an install whose data is not plain files
            (a zipped package: recipes glob seed files, so they need a folder).
    """
    if name not in FOLDERS:
        raise ConfigError(
            f"no shipped folder {name!r}; shipped folders: {', '.join(FOLDERS)}",
            key_path="recipe",
        )
    found = resources.files(f"{__name__}.{name}")
    if not isinstance(found, Path):
        raise ConfigError(
            f"the factory's shipped {name}/ is not a folder on disk ({found!r}); "
            "install the package unzipped (pip install does)",
            key_path="recipe",
        )
    return found


def shipped(relative: str) -> Path:
    """The shipped file ``<folder>/<path>`` (``prompts/amplify.j2``); it may not exist.

    Raises:
        ConfigError: the path does not start with a shipped folder or leaves it.
    """
    head, _, rest = relative.replace("\\", "/").partition("/")
    base = folder(head)
    path = (base / rest).resolve() if rest else base
    if path != base and base.resolve() not in path.parents:
        raise ConfigError(f"{relative!r} leaves the shipped {head}/ folder", key_path="recipe")
    return path


def is_shipped(path: str) -> bool:
    """Whether a recipe path names a shipped file (``factory:prompts/amplify.j2``)."""
    return path.startswith(SCHEME)


def resolve(path: str) -> Path:
    """The file a ``factory:<folder>/<path>`` recipe path names (see :func:`shipped`)."""
    return shipped(path[len(SCHEME) :])
