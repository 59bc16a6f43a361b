"""One stage per module: a function over one row (``process``, or ``aprocess`` for an LLM
stage), built on a worker from a stage spec of typed settings and the driver's ``Domain``;
``base.Stage.run_one`` does the plumbing every stage shares (required columns, rows other
stages rejected passed through, an exception on one row made a failed row)."""
