"""Cohere's v2 Chat API as a factory LLM backend: a provider plug-in written outside factory/."""
