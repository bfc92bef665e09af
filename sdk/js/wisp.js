// wisp.js — the guest side of wisp:plugin@0.2.0 for JavaScript plugins (built with
// @bytecodealliance/componentize-js by build.mjs beside this file). A plugin module imports
// from "wisp" and exports `plugin = definePlugin({...})`; build.mjs puts this file in front of
// it, since componentize-js takes a single module.
import { log as hostLog, enabled as hostEnabled } from 'wisp:plugin/logging@0.2.0';
import { infer as hostInfer } from 'wisp:plugin/models@0.2.0';

const SIZES = {
  'bool': 1, 'uint8': 1, 'uint16': 2, 'uint32': 4, 'uint64': 8, 'int8': 1, 'int16': 2,
  'int32': 4, 'int64': 8, 'fp16': 2, 'fp32': 4, 'fp64': 8, 'bf16': 2, 'bytes': null,
};
const ARRAYS = {
  'uint8': Uint8Array, 'uint16': Uint16Array, 'uint32': Uint32Array, 'uint64': BigUint64Array,
  'int8': Int8Array, 'int16': Int16Array, 'int32': Int32Array, 'int64': BigInt64Array,
  'fp32': Float32Array, 'fp64': Float64Array,
};
const utf8 = { enc: new TextEncoder(), dec: new TextDecoder('utf-8', { fatal: true }) };

/** An error for the client: `code` is one of 'invalid-argument', 'not-found', 'unavailable',
 * 'unsupported', 'internal' (HTTP 400, 404, 503, 501, 500). */
export class WispError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

/** A named tensor: `datatype` is KServe's, lower case ('fp32', 'bytes', ...); `data` holds
 * KServe's binary layout (little-endian; BYTES elements each a 4-byte length and the bytes). */
export class Tensor {
  constructor(name, datatype, shape, data) {
    if (!(datatype in SIZES)) throw new WispError('invalid-argument', `unknown datatype '${datatype}'`);
    this.name = name;
    this.datatype = datatype;
    this.shape = shape.map((d) => BigInt(d));
    this.data = data instanceof Uint8Array ? data : new Uint8Array(data);
  }

  /** Elements in this tensor's shape. */
  get count() {
    return this.shape.reduce((n, d) => n * Number(d), 1);
  }

  /** A numeric tensor from a typed array or a list of numbers. */
  static from(name, datatype, shape, values) {
    const T = ARRAYS[datatype];
    if (datatype === 'bool') {
      return new Tensor(name, datatype, shape, Uint8Array.from(values, (v) => (v ? 1 : 0)));
    }
    if (!T) throw new WispError('unsupported', `Tensor.from cannot build ${datatype}`);
    const typed = values instanceof T ? values : T.from(values);
    return new Tensor(name, datatype, shape, new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength));
  }

  /** A BYTES tensor from strings (UTF-8) or Uint8Arrays. */
  static fromStrings(name, shape, values) {
    const parts = values.map((v) => (typeof v === 'string' ? utf8.enc.encode(v) : v));
    const out = new Uint8Array(parts.reduce((n, p) => n + 4 + p.length, 0));
    const view = new DataView(out.buffer);
    let at = 0;
    for (const p of parts) {
      view.setUint32(at, p.length, true);
      out.set(p, at + 4);
      at += 4 + p.length;
    }
    return new Tensor(name, 'bytes', shape, out);
  }

  /** The elements as a typed array (numeric datatypes but fp16/bf16; a copy, aligned). */
  values() {
    const T = ARRAYS[this.datatype];
    if (this.datatype === 'bool') return Array.from(this.data, (b) => b !== 0);
    if (!T) throw new WispError('unsupported', `tensor '${this.name}': ${this.datatype} has no typed array`);
    return new T(this.data.slice().buffer);
  }

  /** A BYTES tensor's elements as Uint8Arrays. */
  bytes() {
    const out = [];
    const view = new DataView(this.data.buffer, this.data.byteOffset, this.data.byteLength);
    for (let at = 0; at < this.data.length;) {
      const n = view.getUint32(at, true);
      out.push(this.data.subarray(at + 4, at + 4 + n));
      at += 4 + n;
    }
    return out;
  }

  /** A BYTES tensor's elements decoded as UTF-8 (an error names the tensor otherwise). */
  strings() {
    try {
      return this.bytes().map((b) => utf8.dec.decode(b));
    } catch {
      throw new WispError('invalid-argument', `tensor '${this.name}' is not UTF-8`);
    }
  }
}

/** A request `execute` receives: `id`, `inputs`, `requestedOutputs`, `parameters` (an object). */
export class Request {
  constructor(id, inputs, requestedOutputs, parameters) {
    this.id = id;
    this.inputs = inputs;
    this.requestedOutputs = requestedOutputs;
    this.parameters = parameters;
  }

  /** The input called `name`, or an 'invalid-argument' error naming it. */
  input(name) {
    const t = this.inputs.find((i) => i.name === name);
    if (!t) throw new WispError('invalid-argument', `missing input '${name}'`);
    return t;
  }

  /** Whether the client wants output `name`. */
  wants(name) {
    return this.requestedOutputs.length === 0 || this.requestedOutputs.includes(name);
  }
}

function toWitTensor(t) {
  return { name: t.name, datatype: t.datatype, shape: t.shape, data: t.data };
}

function fromWitTensor(t) {
  return new Tensor(t.name, t.datatype, t.shape, t.data);
}

function toWitParam(key, v) {
  if (typeof v === 'boolean') return { key, value: { tag: 'bool', val: v } };
  if (typeof v === 'bigint') return { key, value: { tag: 'int', val: v } };
  if (typeof v === 'number') {
    return Number.isInteger(v) ? { key, value: { tag: 'int', val: BigInt(v) } } : { key, value: { tag: 'double', val: v } };
  }
  return { key, value: { tag: 'text', val: String(v) } };
}

function fromWitParams(params) {
  const out = {};
  for (const p of params) out[p.key] = p.value.tag === 'int' ? Number(p.value.val) : p.value.val;
  return out;
}

function toWitError(e) {
  if (e instanceof WispError) return { code: e.code, message: e.message };
  return { code: 'internal', message: `${e && e.name ? e.name : 'Error'}: ${e && e.message ? e.message : e}` };
}

/** Calls another model with a whole batch at once (it reaches that model's scheduler together):
 * `batch` is a list of `{inputs, requestedOutputs?, parameters?, id?}`; returns one
 * `{outputs}` or `{error}` per request. `model` is `name` or `name:version`. */
export function inferBatch(model, batch) {
  const [name, version] = model.includes(':') ? model.split(':') : [model, undefined];
  const requests = batch.map((r) => ({
    id: r.id || '',
    inputs: r.inputs.map(toWitTensor),
    requestedOutputs: r.requestedOutputs || [],
    parameters: Object.entries(r.parameters || {}).map(([k, v]) => toWitParam(k, v)),
  }));
  let results;
  try {
    results = hostInfer(name, version === undefined ? undefined : BigInt(version), requests);
  } catch (e) {
    const err = e && e.payload ? e.payload : toWitError(e);
    return batch.map(() => ({ error: new WispError(err.code, err.message) }));
  }
  return results.map((r) => (r.tag === 'ok'
    ? { outputs: r.val.outputs.map(fromWitTensor) }
    : { error: new WispError(r.val.code, r.val.message) }));
}

/** One request to another model: its outputs, or a thrown WispError. */
export function infer(model, inputs, requestedOutputs = []) {
  const [r] = inferBatch(model, [{ inputs, requestedOutputs }]);
  if (r.error) throw r.error;
  return r.outputs;
}

/** Log lines into the server's log. */
export const log = {
  trace: (m) => hostLog('trace', String(m)),
  debug: (m) => hostLog('debug', String(m)),
  info: (m) => hostLog('info', String(m)),
  warn: (m) => hostLog('warn', String(m)),
  error: (m) => hostLog('error', String(m)),
  enabled: (level) => hostEnabled(level),
};

/** The `plugin` export from `{ describe?, init?, execute }` or `{ ..., executeBatch }`:
 * `init(params)` gets the config's parameters as an object; `execute(request)` returns an
 * array of Tensors (or throws a WispError); `executeBatch(requests)` returns one array (or
 * WispError) per request; `describe()` returns `{inputs, outputs, maxBatchSize}` with
 * `{name, datatype, dims}` entries, so the model directory needs no config.pbtxt. */
export function definePlugin(impl) {
  let state = null;
  return {
    describe() {
      if (!impl.describe) return undefined;
      const d = impl.describe();
      const spec = (t) => ({ name: t.name, datatype: t.datatype, dims: t.dims.map((x) => BigInt(x)), optional: !!t.optional });
      return { inputs: d.inputs.map(spec), outputs: d.outputs.map(spec), maxBatchSize: d.maxBatchSize || 0 };
    },
    init(parameters) {
      try {
        state = impl.init ? impl.init(Object.fromEntries(parameters)) : {};
        if (state === undefined) state = {};
      } catch (e) {
        const err = new Error(e.message);
        err.payload = toWitError(e);
        throw err;
      }
    },
    execute(batch) {
      const requests = batch.map((r) => new Request(r.id, r.inputs.map(fromWitTensor), r.requestedOutputs, fromWitParams(r.parameters)));
      let answers;
      try {
        answers = impl.executeBatch
          ? impl.executeBatch(requests, state)
          : requests.map((r) => {
            try {
              return impl.execute(r, state);
            } catch (e) {
              return e;
            }
          });
      } catch (e) {
        return batch.map(() => ({ tag: 'err', val: toWitError(e) }));
      }
      return answers.map((a) => (a instanceof Error
        ? { tag: 'err', val: toWitError(a) }
        : { tag: 'ok', val: { outputs: a.map(toWitTensor) } }));
    },
  };
}
