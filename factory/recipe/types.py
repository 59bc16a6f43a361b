"""The recipe types: what a recipe file may hold (``RecipeBase``), and one type per job kind.

Why types and not a ``pipeline`` string with optional sections: each kind needs its
own sections (an amplify recipe an ``llm``, an ``amplify`` section and seeds; an envsim
recipe an ``envsim`` section and a mixture; a mixed recipe its ``parts``), and a type
that declares them required lets the code that runs the job read them without asking
whether they are there. ``Recipe`` is the union, discriminated by the file's ``pipeline``
(and ``parts``: ``pipeline: amplify`` with parts is a ``MixRecipe``), so the YAML stays
as it was. What differs between the kinds is asked of the value (``calls_llm``,
``spend_caps``, ``domains``, ``seed_sections``), never of the ``pipeline`` string.

Every value ``load_recipe`` returns is resolved: each path the recipe names is
absolute (``factory:`` resources included), relative ones taken against the recipe's
folder (``factory.recipe.paths``); ``as_written`` gives the values as the file wrote
them (the config hash and ``run.json`` compare those, so moving a checkout does not
make a resumable folder look like another recipe's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Discriminator, Field, PrivateAttr, Tag

from factory import packs
from factory.recipe.domain import DomainConfig
from factory.recipe.jobs import (
    AmplifyConfig,
    DecontamConfig,
    EnvSimConfig,
    MixtureConfig,
    NearDupConfig,
    PartConfig,
    PrefilterConfig,
    SeedsConfig,
)
from factory.recipe.llm import LLMConfig, PriceConfig
from factory.recipe.output import CacheConfig, OutputConfig, RayConfig
from factory.recipe.section import Section

__all__ = [
    "AmplifyRecipe",
    "CurateRecipe",
    "EnvsimRecipe",
    "MixRecipe",
    "Recipe",
    "RecipeBase",
    "recipe_kind",
]

#: (location in the recipe, value as written, value as resolved) of each resolved path.
Written = list[tuple[tuple[str | int, ...], Any, Any]]


class RecipeBase(Section):
    """Every section a recipe file may hold, each optional that some kind goes without:
    the shipped JSON Schema is this model's (an editor checks a file against it before
    its kind is known). The job kinds below make their own sections required."""

    name: str = Field(description="Recipe name, recorded in the manifest.")
    pipeline: Literal["curate", "amplify", "envsim"] = Field(
        description="curate: validate and convert seeds; amplify: LLM synthesis from seeds; "
        "envsim: simulator training data from the executable world."
    )
    domain: DomainConfig
    seeds: SeedsConfig | None = None
    envsim: EnvSimConfig | None = None
    mixture: MixtureConfig | None = None
    llm: LLMConfig | None = None
    prefilter: PrefilterConfig = Field(default_factory=PrefilterConfig)  # type: ignore[arg-type]
    amplify: AmplifyConfig | None = None
    parts: list[PartConfig] | None = Field(
        None,
        min_length=1,
        description="Mixed amplification: one part per domain, each amplified from its own "
        "seeds to its quota with this recipe's llm, prefilter and amplify settings, into one "
        "dataset whose rows carry their part's label (meta.domain). With parts, the recipe "
        "has no seeds section and domain.name names the mixture.",
    )
    output: OutputConfig
    ray: RayConfig = Field(default_factory=RayConfig)  # type: ignore[arg-type]
    cache: CacheConfig = Field(default_factory=CacheConfig)  # type: ignore[arg-type]
    near_duplicates: NearDupConfig | None = None
    decontamination: DecontamConfig | None = None
    prices: dict[str, PriceConfig] = Field(
        default_factory=dict, description="USD prices per model id, used for cost and planning."
    )

    #: Whether the job's main stream is LLM calls (its workers hold request slots).
    calls_llm: ClassVar[bool] = False

    # Filled by load_recipe, not part of the schema.
    _base_dir: Path = PrivateAttr(default_factory=lambda: Path("."))
    _source: Path | None = PrivateAttr(default=None)  # the recipe file
    _written: Written = PrivateAttr(default_factory=list)

    @property
    def source(self) -> Path | None:
        """The recipe file this was loaded from (None for a recipe built in code)."""
        return self._source

    def resolve(self, path: str) -> Path:
        """A recipe path made absolute against the recipe's folder; ``factory:<folder>/...``
        names a file the factory ships (``factory:prompts/amplify.j2``, see ``factory.packs``).
        ``load_recipe`` already did this for every path field: only for a path the
        recipe does not hold."""
        if packs.is_shipped(path):
            return packs.resolve(path)
        p = Path(path).expanduser()
        return p if p.is_absolute() else (self._base_dir / p).resolve()

    def as_written(self) -> dict[str, Any]:
        """The recipe as JSON data with each resolved path as the file wrote it (a path
        changed since loading, as ``run`` changes ``output.dir``, stays as it is now)."""
        data = self.model_dump(mode="json")
        for loc, written, resolved in self._written:
            node: Any = data
            for step in loc[:-1]:
                if isinstance(node, dict):
                    node = node.get(str(step))
                elif isinstance(node, list) and isinstance(step, int) and step < len(node):
                    node = node[step]
                else:
                    node = None
            if isinstance(node, dict) and node.get(str(loc[-1])) == resolved:
                node[str(loc[-1])] = written
        return data

    def domains(self) -> list[DomainConfig]:
        """The domain sections whose packs the run reads (each part's for a mixed recipe)."""
        return [self.domain]

    def seed_sections(self) -> list[SeedsConfig]:
        """The seed sources the run reads on the driver before it starts (none for envsim)."""
        return []

    def spend_caps(self) -> tuple[float | None, int | None, int | None]:
        """(max_cost_usd, max_tokens, max_calls) of a job that pays for calls; all None else."""
        return (None, None, None)


class CurateRecipe(RecipeBase):
    """``pipeline: curate``: validate and convert seeds (no LLM)."""

    pipeline: Literal["curate"]
    seeds: SeedsConfig

    def seed_sections(self) -> list[SeedsConfig]:
        return [self.seeds]


class AmplifyRecipe(RecipeBase):
    """``pipeline: amplify``: seeds, judged by an LLM, amplified by LLM calls to a target."""

    pipeline: Literal["amplify"]
    seeds: SeedsConfig
    llm: LLMConfig
    amplify: AmplifyConfig
    calls_llm: ClassVar[bool] = True

    def seed_sections(self) -> list[SeedsConfig]:
        return [self.seeds]

    def spend_caps(self) -> tuple[float | None, int | None, int | None]:
        a = self.amplify
        return (a.max_cost_usd, a.max_tokens, a.max_calls)


class EnvsimRecipe(RecipeBase):
    """``pipeline: envsim``: simulator training data from the executable world."""

    pipeline: Literal["envsim"]
    envsim: EnvSimConfig
    mixture: MixtureConfig


class MixRecipe(RecipeBase):
    """``pipeline: amplify`` with ``parts``: one amplify run per domain, one dataset.
    Its seeds are its parts' (no ``seeds``); it selects by quotas (no ``mixture``)."""

    pipeline: Literal["amplify"]
    parts: list[PartConfig] = Field(min_length=1)
    llm: LLMConfig
    amplify: AmplifyConfig
    seeds: None = None
    mixture: None = None
    calls_llm: ClassVar[bool] = True

    def domains(self) -> list[DomainConfig]:
        return [p.domain for p in self.parts]

    def seed_sections(self) -> list[SeedsConfig]:
        return [p.seeds for p in self.parts]

    def spend_caps(self) -> tuple[float | None, int | None, int | None]:
        a = self.amplify
        return (a.max_cost_usd, a.max_tokens, a.max_calls)

    def part(self, index: int) -> AmplifyRecipe:
        """Part ``index`` as an amplify recipe: this recipe's settings with the part's
        domain and seeds (its paths as resolved, its written values kept for the hash)."""
        part = self.parts[index]
        data = {
            name: getattr(self, name)
            for name in RecipeBase.model_fields
            if name not in ("parts", "pipeline", "domain", "seeds")
        }
        sub = AmplifyRecipe.model_construct(
            pipeline="amplify", domain=part.domain, seeds=part.seeds, parts=None, **data
        ).model_copy(deep=True)
        sub._base_dir, sub._source = self._base_dir, self._source
        prefix = ("parts", index)
        sub._written = [
            (loc[2:], w, r) if loc[:2] == prefix else (loc, w, r)
            for loc, w, r in self._written
            if loc[0] != "parts" or loc[:2] == prefix
        ]
        return sub


def recipe_kind(value: Any) -> str | None:
    """The tag of a recipe's kind: ``mix`` for an amplify recipe with parts, else its
    ``pipeline`` (pydantic's discriminator: for raw data and for a built recipe)."""
    get = value.get if isinstance(value, dict) else lambda k: getattr(value, k, None)
    pipeline, parts = get("pipeline"), get("parts")
    if pipeline == "amplify" and parts is not None:
        return "mix"
    return pipeline if isinstance(pipeline, str) else None


Recipe = Annotated[
    Annotated[CurateRecipe, Tag("curate")]
    | Annotated[AmplifyRecipe, Tag("amplify")]
    | Annotated[EnvsimRecipe, Tag("envsim")]
    | Annotated[MixRecipe, Tag("mix")],
    Discriminator(recipe_kind),
]
