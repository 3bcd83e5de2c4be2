"""Error types the engine raises for users: their messages are complete sentences meant to be shown as is."""


class EngineError(RuntimeError):
    """Loading or running the engine failed in a way the user can act on (bad model file, unpatched engine...)."""


class ModelError(EngineError):
    """The model file is missing, not a GGUF, or not a Mixture-of-Experts model."""


class NotPatchedError(EngineError):
    """The installed llama-cpp-python lacks the moeslots patch series (or carries an older one)."""


class BuildError(RuntimeError):
    """A step of `moeslots engine build` failed; the message is meant for the user, one or two lines."""


class PatchError(BuildError):
    """A patch of the series does not apply."""
