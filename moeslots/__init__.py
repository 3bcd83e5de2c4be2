"""moeslots: a terminal chat client for local MoE LLMs with a static, profile-chosen expert cache."""

__version__ = "0.1.0"
