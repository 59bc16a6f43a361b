"""Entry point of ``python -m factory.domain`` (see ``factory.domain``)."""

import sys

from factory.domain import main

if __name__ == "__main__":
    sys.exit(main())
