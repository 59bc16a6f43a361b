"""Which files the ``factory`` distribution holds; the metadata is in ``pyproject.toml``.

Why a ``setup.py``: the repository's data folders (``pipelines/``, ``prompts/``,
``filters/``, ``seeds/``) stay at the root, where the project documents them, and ship as
subpackages of ``factory.packs`` (``package_dir`` maps each one), next to every package
found under ``factory/``. ``pyproject.toml`` cannot combine a package search with extra
mapped packages; this file does, so a new subpackage of ``factory`` needs no edit here.
"""

from setuptools import find_packages, setup

DATA = ("pipelines", "prompts", "filters", "seeds")
#: What a data folder ships: recipes, mixtures, templates, domain packs, rules and seeds
#: (never code: ``seeds/retail/author.py`` is a development script).
DATA_FILES = ["**/*.yaml", "**/*.json", "**/*.jsonl", "**/*.md", "**/*.j2"]

setup(
    packages=[
        *find_packages(include=["factory", "factory.*"]),
        *(f"factory.packs.{d}" for d in DATA),
    ],
    package_dir={f"factory.packs.{d}": d for d in DATA},
    package_data={
        "factory": ["*.json", "schemas/*.json"],
        **{f"factory.packs.{d}": DATA_FILES for d in DATA},
    },
)
