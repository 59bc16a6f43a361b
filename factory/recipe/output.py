"""Where a run writes and with what: the ``output``, ``ray`` and ``cache`` sections.

Why apart from the job sections: every kind of recipe has them, with the same meaning
(``output.dir`` and ``cache.path`` are relative to the working directory, not to the
recipe: an output is where the person running the command wants it).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from factory.recipe.section import Section

__all__ = ["CacheConfig", "OutputConfig", "RayConfig"]


class OutputConfig(Section):
    """The output folder and the rows written to it."""

    dir: str = Field(
        "out",
        description="Output folder, relative to the working directory the run starts in "
        "(not to the recipe), or s3://BUCKET/PREFIX on any S3-compatible store "
        "(docs/cluster.md); overridden by --output.",
    )
    lease_ttl_s: float = Field(
        60.0,
        ge=1,
        description="s3:// output only: how long the output stays held after its run's last "
        "lease renewal (renewed every third of it): a run whose head died frees the output "
        "this long after.",
    )
    dataset_name: str = Field(description="Key of the dataset_info.json entry.")
    shard_rows: int = Field(5000, ge=1, description="Rows per Parquet shard at most.")
    reasoning: Literal["keep", "strip"] = Field(
        "keep", description="keep: <think>...</think> before calls and answers; strip: drop it."
    )
    tokenizer: str | None = Field(
        None,
        description="The model the data trains (a Hugging Face name or a local folder): "
        "OUT/llamafactory/sft.yaml trains it, and its tokenizer (loaded offline with "
        "transformers, when installed and cached) counts the rows' tokens for cutoff_len. "
        "Default: Qwen/Qwen3-8B, counted at 3 characters per token.",
    )
    template: str | None = Field(
        None,
        description="LLaMA-Factory chat template of sft.yaml (one that renders tools: qwen3, "
        "llama3, mistral, glm4 ...); default: told from output.tokenizer's name.",
    )


class RayConfig(Section):
    """Where the run's Ray session comes from and the resources its workers take."""

    address: str | None = Field(
        None,
        description="Ray cluster to join (`ray://head:10001`, `head:6379`, `auto`). Unset: "
        "join the cluster named by RAY_ADDRESS (set by `ray job submit`, and preferred over "
        "this field), else start a private local Ray; never the cluster a stale "
        "$RAY_TMPDIR/ray/ray_current_cluster file names.",
    )
    batch_size: int = Field(
        16,
        ge=1,
        description="No effect: the streaming engine sends each row to a worker as a slot "
        "frees (issue 22); accepted so that older recipes still load.",
    )
    actors: int = Field(2, ge=1, description="Actors per LLM stage.")
    num_cpus: float = Field(
        0.25, gt=0, le=8, description="CPUs per actor (fractional on small machines)."
    )
    placement: Literal["spread", "pack"] = Field(
        "spread",
        description="Where the workers go on a cluster: spread over the nodes (Ray's SPREAD "
        "strategy: a lost node takes as few workers as it can) or packed where Ray likes. "
        "A worker lost with its node is replaced wherever the cluster has room, now or when "
        "a node joins.",
    )


class CacheConfig(Section):
    """The response cache: every completed LLM answer, so none is paid for twice."""

    enabled: bool = Field(True, description="Reuse completed LLM responses (never pay twice).")
    path: str | None = Field(
        None,
        description="Cache location: a folder (relative to the working directory) or a pyarrow "
        "filesystem URI (s3://...) shared by all nodes; default OUTPUT/cache (on the store "
        "itself when the output is s3://).",
    )
