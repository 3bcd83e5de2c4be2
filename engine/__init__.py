"""The patched llama.cpp engine: build pipeline, ctypes bindings, generation, stats. No Textual here."""
