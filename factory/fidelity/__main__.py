"""Entry point of ``python -m factory.fidelity`` (see ``factory.envsim.fidelity``)."""

import sys

from factory.envsim.fidelity import main

if __name__ == "__main__":
    sys.exit(main())
