"""Package data, not code: setup.py ships this folder as ``factory.packs.pipelines``."""
