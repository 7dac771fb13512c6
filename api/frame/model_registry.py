"""The model registry at the edge: a request may only name a model the deployment allows
(``VOICE_MODELS``, see ``VoiceSettings.allowed_models``). Anything else is refused at once with
``422`` and the code ``MODEL_NOT_FOUND`` (seed 000 §3.4): never forwarded to a worker, never
swapped for another model."""

from __future__ import annotations

from collections.abc import Sequence

from fastapi.exceptions import RequestValidationError

MODEL_NOT_FOUND = "MODEL_NOT_FOUND"


def check_model(allowed: Sequence[str], model: str | None, field: str = "model_override"
                ) -> None:
    """422 at ``body.{field}`` (type ``MODEL_NOT_FOUND``) when ``model`` is set and not one of
    ``allowed``; the error lists the models that are."""
    if model is None or model in allowed:
        return
    raise RequestValidationError([{
        "type": MODEL_NOT_FOUND, "loc": ("body", field), "input": model,
        "msg": f"{MODEL_NOT_FOUND}: {field} {model!r} is not one of this deployment's models "
               f"({', '.join(allowed)})",
        "ctx": {"allowed": list(allowed)},
    }])
