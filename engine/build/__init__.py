"""Building the engine: llama-cpp-python's sdist, the patch series (engine/patches), the wheel."""
