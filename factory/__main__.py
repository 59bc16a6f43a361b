"""``python -m factory CMD ...``: the same as the ``factory`` command (``factory.cli``)."""

from factory.cli import entry

if __name__ == "__main__":
    entry()
