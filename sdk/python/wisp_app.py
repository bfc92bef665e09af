"""The component's entry point (`componentize-py ... componentize wisp_app`): runs the module
`model`'s `TritonPythonModel` as the `wisp:plugin/plugin@0.3.0` export."""

import json

from componentize_py_types import Err, Ok
from wit_world import exports
from wit_world.imports import types as _t

import model as _user
from wisp import _host
from wisp._api import ModelConfig, Request, TritonError, _take_senders_used


def _to_value(p):
    return p.value.value


# The user's model object (componentize-py may make a new `Plugin` for every call, so the
# instance lives at module level).
_MODEL = None


class Plugin(exports.Plugin):
    def describe(self):
        complete = getattr(_user.TritonPythonModel, "auto_complete_config", None)
        if complete is None:
            return None
        cfg = complete(ModelConfig()) or None
        if cfg is None:
            return None
        spec = lambda d: _t.TensorSpec(name=d["name"], datatype=_t.Datatype[d["datatype"]],
                                        dims=d["dims"], optional=d["optional"])
        return _t.Signature(inputs=[spec(d) for d in cfg.inputs],
                            outputs=[spec(d) for d in cfg.outputs],
                            max_batch_size=cfg.max_batch_size)

    def init(self, parameters):
        global _MODEL
        try:
            _MODEL = _user.TritonPythonModel()
            init = getattr(_MODEL, "initialize", None)
            if init is not None:
                config = {"parameters": {k: {"string_value": v} for k, v in parameters}}
                init({"model_config": json.dumps(config), "model_instance_kind": "CPU",
                      "model_instance_device_id": "0"})
        except Exception as e:  # noqa: BLE001 - every failure fails the load, with its message
            raise Err(_host.to_wit_error(e))

    def execute(self, batch):
        requests = [
            Request(r.id, [_host.from_wit_tensor(t) for t in r.inputs], list(r.requested_outputs),
                    {p.key: _to_value(p) for p in r.parameters}, i)
            for i, r in enumerate(batch)
        ]
        _take_senders_used()
        if _MODEL is None:
            err = _t.Error(code=_t.ErrorCode.INTERNAL, message="execute called before init")
            return [Err(err) for _ in batch]
        try:
            responses = _MODEL.execute(requests)
        except Exception as e:  # noqa: BLE001 - the whole batch fails with the message
            err = _host.to_wit_error(e)
            return [Err(err) for _ in batch]
        if responses is None and _take_senders_used():
            # A decoupled model answered through its senders (Triton's execute returns None):
            # each request not closed yet is closed with the final flag alone.
            return [Ok(_t.Response(outputs=[])) for _ in batch]
        if responses is None or len(responses) != len(batch):
            n = "no" if responses is None else len(responses)
            err = _t.Error(code=_t.ErrorCode.INTERNAL,
                           message=f"execute returned {n} responses for {len(batch)} requests")
            return [Err(err) for _ in batch]
        out = []
        for r in responses:
            if r.has_error():
                out.append(Err(_host.to_wit_error(r.error())))
            else:
                out.append(Ok(_t.Response(
                    outputs=[_host.to_wit_tensor(t) for t in r.output_tensors()])))
        return out
