"""I/O: seed readers, the Parquet shard writer, the response cache and run state.

Everything that reads or writes files of a run, and nothing that decides what a
row means (that is ``factory.core``). See ARCHITECTURE.md for the layers.
"""
