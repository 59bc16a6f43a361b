"""Step decomposition: one executed tool call becomes one simulator training sample.

Why: a world model (EnvSimBench's simulator) is trained on transitions
``(s_t, a_t, code(a_t)) -> (o_t, s_t+1)``, not on whole conversations. Replaying
a trajectory's calls in an executable world gives every transition exactly;
slicing keeps each one to the few objects the call reads or writes, so a sample
is kilobytes and holds everything that decides its outcome.

What a :class:`StepSample` guarantees (checked by :func:`check_step`):

* ``apply(delta, state_before) == state_after`` (same JSON, types included);
* running the call on a copy of ``state_before`` alone gives ``observation``
  and ends in ``state_after`` (the slice is sufficient);
* ``labels`` are :func:`factory.core.labels.step_labels` of the sample and ``id``
  is its content hash.

``state_after`` is the slice of the next full state over the objects of the
slice *after* the call, so it includes what the call created (a booking's new
reservation); it comes from the full world, never from the slice run, so the
check above compares two independent executions.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import sys
from collections.abc import Iterable, Iterator
from copy import deepcopy
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from factory.core.delta import DeltaError, apply, diff, same_json
from factory.core.labels import step_labels
from factory.core.trajectory import Trajectory, canonical_json
from factory.envs.base import Environment
from factory.envs.plugin import Slicing
from factory.envs.registry import get_plugin
from factory.errors import FactoryError, short

__all__ = [
    "StepError",
    "StepSample",
    "check_step",
    "decompose",
    "decompose_calls",
    "step_id",
    "tool_source",
]


class StepError(FactoryError):
    """A step sample contradicts itself or the world it claims to come from."""

    reason = "bad_step_sample"  # the registered code of unusable step samples


# --- per-domain slicing ---------------------------------------------------------------------


def _slicing(domain: str) -> Slicing:
    """The domain plug-in's slicing (ConfigError naming the domains that have one)."""
    slicing = get_plugin(domain, needs="slicing").slicing
    assert slicing is not None
    return slicing


# --- the sample -------------------------------------------------------------------------------


def step_id(env_id: str, step: int, tool: str, arguments: Any, state_before: Any) -> str:
    """Content hash of a transition's inputs (24 hex chars of SHA-256)."""
    body = {
        "env_id": env_id,
        "step": step,
        "tool": tool,
        "arguments": arguments,
        "state_before": state_before,
    }
    return hashlib.sha256(canonical_json(body).encode("utf-8")).hexdigest()[:24]


@dataclass
class StepSample:
    """One executed call: the slice before it, its observation, Δ and the slice after it."""

    id: str
    env_id: str
    task_id: str | None
    user_id: str | None
    step: int
    tool: str
    arguments: dict[str, Any]
    state_before: dict[str, Any]
    observation: str
    delta: list[dict[str, Any]]
    state_after: dict[str, Any]
    labels: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (independent copies of every nested value)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepSample:
        """Inverse of :meth:`to_dict`.

        Raises:
            StepError: ``data`` is not a dict with every field of a sample.
        """
        names = [f.name for f in fields(cls)]
        if not isinstance(data, dict):
            raise StepError(f"a step sample is a JSON object, not {type(data).__name__}")
        missing = [n for n in names if n not in data]
        if missing:
            raise StepError(f"step sample lacks field(s) {', '.join(missing)}")
        return cls(**{n: deepcopy(data[n]) for n in names})


# --- decomposition ------------------------------------------------------------------------------


def _as_text(value: Any) -> str | None:
    return None if value is None else str(value)


def decompose(
    traj: Trajectory,
    env: Environment,
    *,
    env_id: str,
    task_id: str | None = None,
    user_id: str | None = None,
    check: bool = False,
) -> Iterator[StepSample]:
    """Replay every tool call of ``traj`` on ``env``, in order, one sample per call.

    Recorded observations are ignored: the samples carry what ``env`` answers.

    Args:
        traj: the trajectory; ``task_id``/``user_id`` default to its metadata.
        env: a fresh fork of the world the trajectory starts in; it is stepped.
        env_id: the world's identity (which database / generator seed).
        task_id, user_id: provenance overriding the trajectory's metadata.
        check: run :func:`check_step` on every sample before yielding it.

    Raises:
        ConfigError: the domain of ``env`` has no state slices.
        StepError: a call's arguments are not an object, or (``check``) a sample
            breaks its guarantees.
    """
    meta = traj.metadata
    yield from decompose_calls(
        ((c.name, c.arguments) for _, c in traj.calls()),
        env,
        env_id=env_id,
        task_id=task_id if task_id is not None else _as_text(meta.get("task_id")),
        user_id=user_id if user_id is not None else _as_text(meta.get("user_id")),
        check=check,
    )


def decompose_calls(
    calls: Iterable[tuple[str, dict[str, Any]]],
    env: Environment,
    *,
    env_id: str,
    task_id: str | None = None,
    user_id: str | None = None,
    check: bool = False,
) -> Iterator[StepSample]:
    """Like :func:`decompose`, over raw ``(tool name, arguments)`` pairs."""
    slicing = _slicing(env.domain)
    for step, (name, arguments) in enumerate(calls):
        sample = _execute_step(
            slicing, env, step, name, arguments, env_id=env_id, task_id=task_id, user_id=user_id
        )
        if check:
            check_step(sample, domain=env.domain)
        yield sample


def _execute_step(
    slicing: Slicing,
    env: Environment,
    step: int,
    name: str,
    arguments: Any,
    *,
    env_id: str,
    task_id: str | None,
    user_id: str | None,
) -> StepSample:
    if not isinstance(arguments, dict):
        raise StepError(
            f"step {step} ({short(name, 60)}): arguments must be an object, "
            f"not {type(arguments).__name__}; repair the trajectory first"
        )
    arguments = deepcopy(arguments)
    before = slicing.slice_for(env.state, name, arguments)
    # The slice run only tells which objects exist after the call (what it created);
    # their values are read from the full world below.
    on_slice = slicing.world(before, env)
    on_slice.execute(name, arguments)
    observation = env.execute(name, arguments)
    after = slicing.project(env.state, on_slice.state)
    delta = diff(before, after)
    return StepSample(
        id=step_id(env_id, step, name, arguments, before),
        env_id=env_id,
        task_id=task_id,
        user_id=user_id,
        step=step,
        tool=name,
        arguments=arguments,
        state_before=before,
        observation=observation,
        delta=delta,
        state_after=after,
        labels=step_labels(
            observation, delta, arguments, task_id=task_id, user_id=user_id, env_id=env_id
        ),
    )


def check_step(sample: StepSample, *, domain: str) -> None:
    """Check every guarantee of a sample (see the module docstring).

    The call is re-run on a world that validates arguments (the environments'
    default); a sample recorded without validation may differ on malformed calls.

    Args:
        sample: the sample; not modified.
        domain: the domain whose tools and slices the sample uses.

    Raises:
        StepError: the first guarantee that does not hold, naming the step and tool.
        ConfigError: ``domain`` has no state slices.
    """
    where = f"step {sample.step} ({short(sample.tool, 60)}, id {sample.id})"
    try:
        applied = apply(sample.delta, sample.state_before)
    except DeltaError as exc:
        raise StepError(f"{where}: Δ does not apply to state_before: {exc}") from exc
    if not same_json(applied, sample.state_after):
        raise StepError(f"{where}: apply(delta, state_before) differs from state_after")
    on_slice = _slicing(domain).world(deepcopy(sample.state_before), None)
    observation = on_slice.execute(sample.tool, deepcopy(sample.arguments))
    if observation != sample.observation:
        raise StepError(
            f"{where}: the slice is not sufficient: running the call on it answers "
            f"{short(observation, 120)} instead of {short(sample.observation, 120)}"
        )
    if not same_json(on_slice.state, sample.state_after):
        raise StepError(f"{where}: running the call on the slice ends in another state_after")
    expected_id = step_id(
        sample.env_id, sample.step, sample.tool, sample.arguments, sample.state_before
    )
    if sample.id != expected_id:
        raise StepError(f"{where}: id is not the content hash {expected_id}")
    labels = step_labels(
        sample.observation,
        sample.delta,
        sample.arguments,
        task_id=sample.task_id,
        user_id=sample.user_id,
        env_id=sample.env_id,
    )
    if sample.labels != labels:
        raise StepError(f"{where}: labels {short(sample.labels)} should be {short(labels)}")


# --- code(a): the tool's implementation ----------------------------------------------------------


@functools.cache
def _module_definitions(module_name: str) -> tuple[dict[str, ast.stmt], dict[str, str]]:
    """Top-level definitions of a module by name: their nodes and source text."""
    source = inspect.getsource(sys.modules[module_name])
    nodes: dict[str, ast.stmt] = {}
    texts: dict[str, str] = {}
    for node in ast.parse(source).body:
        names: list[str] = []
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names = [node.target.id]
        text = ast.get_source_segment(source, node)
        for name in names:
            if text is not None:
                nodes[name], texts[name] = node, text
    return nodes, texts


@functools.cache
def tool_source(domain: str, tool_name: str) -> str | None:
    """The Python source of a tool, for the ``code(a)`` field of simulator training data.

    The tool's function comes first, then every module-level helper and constant
    it uses (transitively), in module order: what a reader needs to predict the
    call's observation and Δ without the rest of the module.

    Returns:
        The source text, or ``None`` for a domain without tool functions or an unknown tool.

    Raises:
        ConfigError: ``domain`` is not registered.
    """
    plugin = get_plugin(domain)
    tools = plugin.tool_functions() if plugin.tool_functions is not None else {}
    fn = tools.get(tool_name)
    if fn is None:
        return None
    nodes, texts = _module_definitions(fn.__module__)
    if fn.__name__ not in nodes:
        return inspect.getsource(fn)
    order = list(nodes)
    needed = {fn.__name__}
    todo = [fn.__name__]
    while todo:
        for sub in ast.walk(nodes[todo.pop()]):
            if isinstance(sub, ast.Name) and sub.id in nodes and sub.id not in needed:
                needed.add(sub.id)
                todo.append(sub.id)
    helpers = sorted(needed - {fn.__name__}, key=order.index)
    parts = [texts[fn.__name__], *(texts[name] for name in helpers)]
    return "\n\n\n".join(parts) + "\n"
