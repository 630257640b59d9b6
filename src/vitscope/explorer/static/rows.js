// vitscope explorer, part 2 of 5: attention rows computed from queries and keys (vitscope.explorer.rows), in
// float64: logits = scale q . k over every key, then the layer's normaliser. Each normaliser mirrors
// vitscope.attention (solvers.py): rows shifted by their maximum; sparsemax and entmax-1.5 by their exact
// sort-based thresholds, alpha in (1, 2) by Newton's method on the p-norm form from below, any other alpha by
// bisection as the entmax package does it. Exact zeros are the keys at or below the threshold.
function shifted(x, scale) {
  let m = -Infinity;
  for (let i = 0; i < x.length; i++) if (x[i] > m) m = x[i];
  const z = new Float64Array(x.length);
  for (let i = 0; i < x.length; i++) z[i] = (x[i] - m) * scale;
  return z;
}
function softmaxRow(x) {
  const p = shifted(x, 1);
  let s = 0;
  for (let i = 0; i < p.length; i++) { p[i] = Math.exp(p[i]); s += p[i]; }
  for (let i = 0; i < p.length; i++) p[i] /= s;
  return p;
}
function descending(z) { return Float64Array.from(z).sort().reverse(); }
function sparsemaxRow(x) {  // tau = (sum of the k largest - 1) / k for the largest k with 1 + k z_(k) > that sum
  const z = shifted(x, 1), u = descending(z);
  let total = 0, tau = u[0] - 1;
  for (let k = 0; k < u.length; k++) {
    total += u[k];
    const t = (total - 1) / (k + 1);
    if (u[k] > t) tau = t; else break;
  }
  for (let i = 0; i < z.length; i++) z[i] = Math.max(z[i] - tau, 0);
  return z;
}
function entmax15Row(x) {  // Peters et al. (2019), Algorithm 2: z = (x - max) / 2, p = [z - tau]_+^2
  const z = shifted(x, 0.5), u = descending(z);
  let s1 = 0, s2 = 0, support = 0, tau = u[0] - 1;
  const taus = new Float64Array(u.length);
  for (let k = 0; k < u.length; k++) {
    s1 += u[k]; s2 += u[k] * u[k];
    const n = k + 1, mean = s1 / n, delta = (1 - n * (s2 / n - mean * mean)) / n;
    taus[k] = mean - Math.sqrt(Math.max(delta, 0));
    if (taus[k] <= u[k]) support += 1;
  }
  if (support > 0) tau = taus[support - 1];
  for (let i = 0; i < z.length; i++) { const g = Math.max(z[i] - tau, 0); z[i] = g * g; }
  return z;
}
function newtonRow(x, alpha) {  // alpha in (1, 2): ||[z - tau]_+||_p = 1 with p = 1 / (alpha - 1)
  const z = shifted(x, alpha - 1), power = 1 / (alpha - 1);
  let tau = -1;
  for (let it = 0; it < 64; it++) {
    let total = 0, slope = 0;
    for (let i = 0; i < z.length; i++) {
      const g = z[i] - tau;
      if (g > 0) { const gp = Math.pow(g, power - 1); total += gp * g; slope += gp; }
    }
    const step = (total - Math.pow(total, 1 - 1 / power)) / slope;
    tau += step;
    if (Math.abs(step) <= 16 * Number.EPSILON) break;
  }
  return renormalised(z, tau, power);
}
function bisectionRow(x, alpha) {  // any other alpha > 0 but 1, as vitscope.attention.solvers.bisection
  const scale = alpha - 1, z = shifted(x, scale), power = 1 / scale;
  let lo = -1, dm = -Math.pow(1 / z.length, scale) - lo, mid = lo;
  for (let step = 0; step < 100; step++) {
    dm /= 2; mid = lo + dm;
    let total = 0;
    for (let i = 0; i < z.length; i++) total += Math.pow(Math.max(z[i] - mid, 0), power);
    if (step % 8 === 7 && mid === lo) break;
    if (total >= 1) lo = mid;
  }
  return renormalised(z, mid, power);
}
function renormalised(z, tau, power) {
  let s = 0;
  for (let i = 0; i < z.length; i++) { z[i] = Math.pow(Math.max(z[i] - tau, 0), power); s += z[i]; }
  for (let i = 0; i < z.length; i++) z[i] /= s;
  return z;
}
// probabilities from logits by a layer's normaliser spec ({kind, alpha: [one per kept head]}) for kept head `slot`
function normalizeRow(spec, logits, slot) {
  if (spec.kind === 'softmax') return softmaxRow(logits);
  if (spec.kind === 'sparsemax') return sparsemaxRow(logits);
  if (spec.kind === 'entmax15') return entmax15Row(logits);
  if (spec.kind !== 'alpha') throw new Error(`normaliser ${spec.kind} is unknown`);
  const alpha = spec.alpha[slot || 0];
  if (alpha === 1) return softmaxRow(logits);
  if (alpha === 1.5) return entmax15Row(logits);
  if (alpha === 2) return sparsemaxRow(logits);
  return alpha > 1 && alpha < 2 ? newtonRow(logits, alpha) : bisectionRow(logits, alpha);
}
const rowCache = new Map();  // recent rows: hovering and the small multiples ask for the same ones again
function qkRow(layer, image, slot, row) {  // {row: Float64Array over the keys, error: fraction of its maximum}
  const part = layer.qk.heads[slot][image], key = `${layer.uid}|${image}|${slot}|${row}`;
  let values = rowCache.get(key);
  if (!values) {
    const q = view(part.q), k = view(part.k), [keys, D] = part.k.shape, scale = layer.qk.scale, base = row * D;
    const logits = new Float64Array(keys);
    for (let j = 0; j < keys; j++) {
      let s = 0;
      for (let d = 0, kb = j * D; d < D; d++) s += q[base + d] * k[kb + d];
      logits[j] = s * scale;
    }
    values = normalizeRow(layer.qk.normalizer, logits, slot);
    if (rowCache.size > 1024) rowCache.delete(rowCache.keys().next().value);
    rowCache.set(key, values);
  }
  return {row: values, error: part.error + META.precision.arithmetic};
}
