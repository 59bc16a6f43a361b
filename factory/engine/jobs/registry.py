"""From a recipe's job kind to its job: the one place that tells the kinds apart.

Why a registry: the runner runs whatever job a recipe declares through the one
contract (``factory.engine.loop.Job``) and must not know the kinds; a new kind is an
entry here (its declaration, its input check), not a branch in the runner. The
shape follows Ray Data LLM's ``ProcessorBuilder.register(config_type, builder)``.

The key is the recipe's type (``factory.recipe``: ``CurateRecipe``, ``AmplifyRecipe``,
``EnvsimRecipe``, ``MixRecipe``): the recipe loader already told the kinds apart, and
nothing here or elsewhere reads ``pipeline`` again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from factory.engine.budget import check_cost_cap_priced
from factory.engine.jobs.amplify import AmplifyJob
from factory.engine.jobs.curate import CurateJob
from factory.engine.jobs.envsim import EnvsimJob
from factory.engine.jobs.mix import MixJob, check_part_seeds
from factory.engine.loop import Job
from factory.engine.pipeline import check_seed_files
from factory.engine.stages.base import StageSpec
from factory.errors import ConfigError
from factory.io.writer import Manifest
from factory.recipe import AmplifyRecipe, CurateRecipe, EnvsimRecipe, MixRecipe, Recipe

__all__ = ["JOBS", "AddChain", "Entry", "JobFactory", "check_inputs", "declare"]

#: Declares a chain the workers run from now on (``ActorPool.add_chain``).
AddChain = Callable[[str, Sequence[StageSpec]], None]
#: Declares the job of a recipe writing into a folder (manifest: the run's own).
JobFactory = Callable[[Any, Path, Manifest, AddChain], Job]
#: Checks a recipe's inputs before the output folder or Ray is touched (the folder:
#: where a part's own folder will be).
InputCheck = Callable[[Any, Path], None]


def _curate(cfg: CurateRecipe, out_dir: Path, manifest: Manifest, add_chain: AddChain) -> Job:
    return CurateJob(cfg, out_dir, manifest)


def _amplify(cfg: AmplifyRecipe, out_dir: Path, manifest: Manifest, add_chain: AddChain) -> Job:
    return AmplifyJob(cfg, out_dir, manifest, add_chain)


def _envsim(cfg: EnvsimRecipe, out_dir: Path, manifest: Manifest, add_chain: AddChain) -> Job:
    return EnvsimJob(cfg, out_dir, manifest)


def _mix(cfg: MixRecipe, out_dir: Path, manifest: Manifest, add_chain: AddChain) -> Job:
    return MixJob(cfg, out_dir, manifest, add_chain)


def _seeds(cfg: CurateRecipe, out_dir: Path) -> None:
    check_seed_files(cfg.seeds)


def _seeds_and_prices(cfg: AmplifyRecipe, out_dir: Path) -> None:
    """The seeds, then a cost cap over an unpriced model (it could never stop the run)."""
    check_seed_files(cfg.seeds)
    check_cost_cap_priced(cfg)


def _parts_and_prices(cfg: MixRecipe, out_dir: Path) -> None:
    check_part_seeds(cfg, out_dir)
    check_cost_cap_priced(cfg)


def _nothing(cfg: EnvsimRecipe, out_dir: Path) -> None:
    """envsim samples its episodes: it reads no seed file."""


@dataclass(frozen=True)
class Entry:
    """One job kind: its job of the one loop, and the check of its inputs."""

    check_inputs: InputCheck
    job: JobFactory


#: The job of each recipe type. The factories and checks take their own type: the key is
#: the type they are looked up by, so each receives only what it declares.
JOBS: dict[type[Recipe], Entry] = {
    CurateRecipe: Entry(_seeds, job=_curate),
    AmplifyRecipe: Entry(_seeds_and_prices, job=_amplify),
    EnvsimRecipe: Entry(_nothing, job=_envsim),
    MixRecipe: Entry(_parts_and_prices, job=_mix),
}


def _entry(cfg: Recipe) -> Entry:
    entry = JOBS.get(type(cfg))
    if entry is None:
        raise ConfigError(f"no job runs a {type(cfg).__name__}", key_path="pipeline")
    return entry


def check_inputs(cfg: Recipe, out_dir: Path) -> None:
    """Before the folder or Ray: unusable inputs (seed files, a cost cap over an unpriced
    model) stop the run here."""
    _entry(cfg).check_inputs(cfg, out_dir)


def declare(cfg: Recipe, out_dir: Path, manifest: Manifest, add_chain: AddChain) -> Job:
    """The job ``cfg`` declares, writing into ``out_dir``.

    Raises:
        ConfigError: no job runs the recipe's type.
    """
    return _entry(cfg).job(cfg, out_dir, manifest, add_chain)
