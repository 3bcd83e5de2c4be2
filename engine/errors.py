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


class ClosedError(EngineError):
    """A model, context, MTP draft context or engine used after its close(): refused with this error where the native
    call would read freed memory and crash the process (the message: "the model is closed", "this engine is closed")."""


def refuse_closed(closed: bool, what: str) -> None:
    """Raise ClosedError("<what> is closed") when closed: one flag check, cheap enough for every call."""
    if closed:
        raise ClosedError(f"{what} is closed")
