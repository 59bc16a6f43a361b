"""One module per job kind (curate, amplify, envsim, mix), each implementing the one job
contract (``factory.engine.loop.Job``); ``registry`` maps a recipe's kind to its job.

``runner`` finds a job only through ``registry``; the jobs share the run's result type and
manifest from ``factory.engine.result``, so nothing here imports ``runner``.
"""
