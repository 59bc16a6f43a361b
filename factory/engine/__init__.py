"""Engine: the Ray plumbing that turns a recipe into a run.

Ray Data adapters (``raycompat``), one stage per module (``stages/``), the seed
pipeline, the jobs (curate in ``runner``, amplify and envsim in ``jobs/``),
budget, plan, console and interrupt handling. It names no domain: domains come
through ``factory.envs``'s registry. See ARCHITECTURE.md for the layers.
"""
