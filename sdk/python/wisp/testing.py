"""Native tests for plugins that call models: `serve("model", fn)` answers calls to that model
with `fn(request) -> InferenceResponse` (outside the server only); `sent()` is what a decoupled
model's response senders sent."""

_MODELS = {}
_CALLS = {}
_SENT = []


def sent():
    """What decoupled senders sent since the last call: `(request index, InferenceResponse or
    None, final)` tuples, in order (taken)."""
    out = list(_SENT)
    _SENT.clear()
    return out


def serve(model, fn):
    """Calls to `model` are answered by `fn(InferenceRequest) -> InferenceResponse`."""
    _MODELS[model] = fn
    _CALLS[model] = 0


def calls(model):
    """How many calls (batches) `model` received."""
    return _CALLS.get(model, 0)


def clear():
    """Forgets every registered model and sent response."""
    _MODELS.clear()
    _CALLS.clear()
    _SENT.clear()


def _call(model, requests):
    from wisp._api import InferenceResponse, TritonError

    if model not in _MODELS:
        err = TritonError(f"Request for unknown model: '{model}' is not found "
                          "(register it with wisp.testing.serve)", TritonError.NOT_FOUND)
        return [InferenceResponse(error=err) for _ in requests]
    _CALLS[model] += 1
    return [_MODELS[model](r) for r in requests]
