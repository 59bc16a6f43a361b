"""Environment simulation: step samples, the sampler driver, grounding, the simulator format.

Domain-free drivers over ``factory.envs``'s interface: a domain supplies its
world through its plug-in and these modules run it (sample episodes, cut them
into step samples, ground an amplified answer, score a simulator's prediction,
replay recorded trajectories for fidelity). See ARCHITECTURE.md for the layers.
"""
