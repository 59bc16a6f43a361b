"""Engine: the streaming engine that runs a typed recipe (``factory.recipe``) to its output.

Layers of its own, top to bottom (an import-linter contract in ``pyproject.toml``):
``runner`` (folder, Ray, the loop, the manifest) and ``plan``; ``jobs/`` (one job per
recipe type, found through ``jobs.registry``, each implementing ``loop.Job``); ``result``;
the one driver loop (``loop``) with the sinks' ``collect``, ``health``, ``serve`` and
``budget``; ``ledger`` (the run's accounts and its one cap calculation), ``pool`` (the
workers as Ray actors), ``pipeline`` and ``filing`` (the one way a row is filed); the
workers (``worker``, ``roster``); one stage per module (``stages/``); and the leaves
(``settings``: per-stage settings resolved once; ``rows``: the typed row; ``work``,
``prompts``, ``quality``, ``watchdog``, ``console``, ``raycompat``, ``interrupts``). It names
no domain: domains come through ``factory.envs``'s registry. See ARCHITECTURE.md.
"""
