"""The patched engine's C API from Python (ctypes): the expert cache, routing stats and replay, the tier."""
