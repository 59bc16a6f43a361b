"""``python -m factory.fidelity``: the command; the replay lives in ``factory.envsim.fidelity``.

A package (not a module next to the layer) so the command keeps its documented
name while its code lives in its layer.
"""
