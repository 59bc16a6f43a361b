"""Simulated environments for RL (Simia-RL): LLM-simulated users and tools, rewards, servers.

``SimEnv`` (``env``) plays one episode of a domain in mode ``llm``, ``executor`` or
``hybrid``; ``DomainSpec`` (``spec``) is what all episodes of a served domain share;
``RoleLLM`` (``llm``) answers the user, tool and judge prompts through the factory's
backends, response cache and budget; ``tasks`` reads tau-bench task files and derives
tasks from seeds; ``gym`` is the in-process gymnasium-style class; ``server`` serves
episodes with openenv-core over HTTP and WebSocket; ``rollout`` writes episodes as
LLaMA-Factory rows. ``python -m factory.simenv serve`` starts a server.
"""
