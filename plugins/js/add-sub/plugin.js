// add-sub in JavaScript: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 on 16 floats.
// It describes itself, so its model directory needs no config.pbtxt. The JS side of the
// per-request cost benchmark.
import { definePlugin, Tensor, WispError } from 'wisp';

export const plugin = definePlugin({
  describe() {
    const spec = (name) => ({ name, datatype: 'fp32', dims: [16] });
    return { inputs: [spec('INPUT0'), spec('INPUT1')], outputs: [spec('OUTPUT0'), spec('OUTPUT1')], maxBatchSize: 8 };
  },
  execute(request) {
    const a = request.input('INPUT0');
    const b = request.input('INPUT1');
    const x = a.values();
    const y = b.values();
    if (x.length !== y.length) throw new WispError('invalid-argument', 'INPUT0 and INPUT1 differ in size');
    const sum = new Float32Array(x.length);
    const diff = new Float32Array(x.length);
    for (let i = 0; i < x.length; i++) {
      sum[i] = x[i] + y[i];
      diff[i] = x[i] - y[i];
    }
    const out = [];
    if (request.wants('OUTPUT0')) out.push(Tensor.from('OUTPUT0', 'fp32', a.shape, sum));
    if (request.wants('OUTPUT1')) out.push(Tensor.from('OUTPUT1', 'fp32', a.shape, diff));
    return out;
  },
});
