"""openclaw-rl: an LLM agent that improves simply by being used."""

__version__ = "0.1.0"
