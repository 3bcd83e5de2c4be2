"""The model and its contexts over llama.cpp's C API: load, decode, MTP drafts, chat templates, GGUF checks."""
