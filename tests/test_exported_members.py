from __future__ import annotations

import subprocess
import sys

import pytest

import factory


def test_all_is_sorted_and_resolves() -> None:
    names = [n for n in factory.__all__ if n != "__version__"]
    assert names == sorted(names, key=lambda n: (not n.isupper(), n))
    for name in factory.__all__:
        assert getattr(factory, name) is not None


@pytest.mark.slow
def test_importing_factory_stays_light() -> None:
    code = "import sys, factory; print(' '.join(m for m in ('ray', 'aiohttp', 'openai')"
    code += " if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
