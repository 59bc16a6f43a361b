"""One module per pipeline kind past ``curate`` (which lives in ``factory.engine.runner``).

``runner`` dispatches to these lazily; they share the run's result type and
manifest from ``factory.engine.result``, so nothing here imports ``runner``.
"""
