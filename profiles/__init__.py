"""Routing traces, profiles, slot plans and the policy simulator (pure Python + numpy)."""
