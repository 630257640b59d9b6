// vitscope explorer, part 1 of 5 (vitscope.explorer.page joins the parts inside one function scope):
// the payload, the selection state and the rows (dequantised maps, or computed from queries and keys: rows.js).
const META = JSON.parse(document.getElementById('vitscope-meta').textContent);
const SIZE = 288, SMALL = 92;
const LUT = META.colormap, ZERO = META.zero_colour;
const state = {image: 0, layer: 0, head: 'mean', cls: false, point: {x: 0.5, y: 0.5}, hover: null,
  view: 'attention', scale: 'row', alpha: 0.6};
const BUFS = {};
const pictures = [];
const views = new Map();
const $ = (id) => document.getElementById(id);
const el = (tag, attrs, text) => {
  const node = document.createElement(tag);
  Object.entries(attrs || {}).forEach(([k, v]) => node.setAttribute(k, v));
  if (text !== undefined) node.textContent = text;
  return node;
};
const fmt = (v, d) => (v === null || v === undefined || Number.isNaN(v)) ? '–' : Number(v).toFixed(d === undefined ? 3 : d);

// ---------- data ----------
// The blobs are written byte for byte into the windows-1252 page (vitscope.explorer.blob): each character is one
// byte (bytes 0x80-0x9F read as windows-1252's characters; as themselves when the page came as a string, e.g. a
// Jupyter srcdoc), and "=" with a digit stands for "=", NUL, CR or "<".
const WINDOWS_1252 = [0x20AC, 0x81, 0x201A, 0x192, 0x201E, 0x2026, 0x2020, 0x2021, 0x2C6, 0x2030, 0x160, 0x2039,
  0x152, 0x8D, 0x17D, 0x8F, 0x90, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014, 0x2DC, 0x2122, 0x161,
  0x203A, 0x153, 0x9D, 0x17E, 0x178];  // bytes 0x80..0x9F
const ESCAPED = [0x3D, 0x00, 0x0D, 0x3C];
function textBytes(text) {
  const byteOf = new Uint8Array(0x2123);
  for (let c = 0; c < 256; c++) byteOf[c] = c;
  WINDOWS_1252.forEach((code, i) => { byteOf[code] = 0x80 + i; });
  const out = new Uint8Array(text.length);
  let n = 0;
  for (let i = 0; i < text.length; i++) {
    const b = byteOf[text.charCodeAt(i)];
    out[n++] = b === 0x3D ? ESCAPED[text.charCodeAt(++i) - 48] : b;
  }
  return out.subarray(0, n);
}
async function decode() {
  for (const name of Object.keys(META.blobs)) {
    const bytes = textBytes(document.getElementById('vitscope-blob-' + name).textContent);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
    BUFS[name] = await new Response(stream).arrayBuffer();
  }
}
let HALF = null;  // float16 bit patterns -> values
function halfTable() {
  const t = new Float32Array(65536);
  for (let h = 0; h < 65536; h++) {
    const sign = h & 0x8000 ? -1 : 1, e = (h >> 10) & 31, f = h & 1023;
    t[h] = e === 0 ? sign * f * 2 ** -24 : e === 31 ? (f ? NaN : sign * Infinity) : sign * (1 + f / 1024) * 2 ** (e - 15);
  }
  return t;
}
function view(ref) {  // the typed array of a reference; float16 (two byte planes) decoded to float32 once
  if (!views.has(ref)) {
    const buf = BUFS[ref.blob];
    if (ref.dtype === 'float16') {
      HALF = HALF || halfTable();
      const lo = new Uint8Array(buf, ref.offset, ref.length), hi = new Uint8Array(buf, ref.offset + ref.length, ref.length);
      const out = new Float32Array(ref.length);
      for (let i = 0; i < ref.length; i++) out[i] = HALF[lo[i] | (hi[i] << 8)];
      views.set(ref, out);
    } else {
      const T = {uint8: Uint8Array, int32: Int32Array, float32: Float32Array}[ref.dtype];
      views.set(ref, new T(buf, ref.offset, ref.length));
    }
  }
  return views.get(ref);
}
const models = () => META.models;
const layerOf = (m) => m.layers[state.layer];
function headSlot(layer) {  // index into layer.heads of the selected head, or -1 for the mean
  if (state.head === 'mean') return -1;
  const k = layer.heads.indexOf(state.head);
  if (k >= 0) return k;
  let best = 0;  // nearest kept head
  layer.heads.forEach((h, i) => { if (Math.abs(h - state.head) < Math.abs(layer.heads[best] - state.head)) best = i; });
  return best;
}
function queryCell(layer, point) {
  const [gh, gw] = layer.geometry.grid;
  const r = Math.min(gh - 1, Math.max(0, Math.floor(point.y * gh)));
  const c = Math.min(gw - 1, Math.max(0, Math.floor(point.x * gw)));
  return r * gw + c;
}
function hasCls(layer) { return layer.geometry.labels.indexOf('CLS') >= 0; }
function canonicalRow(layer, query) {
  if (query === 'cls') return 0;
  const g = layer.geometry;
  if (g.kind === 'window') return view(layer.arrays.row_of_cell)[query];
  return g.prefix + query;
}
function rowValues(layer, image, slot, row) {  // probabilities over the row's keys, and a bound on their error
  const H = layer.heads.length, slots = slot < 0 ? [...Array(H).keys()] : [slot];
  if (layer.form === 'qk') {
    const rows = slots.map((k) => qkRow(layer, image, k, row)), out = new Float64Array(rows[0].row.length);
    // the mean of the heads' bounds: each is its measured error e times the true row's maximum, which is at most
    // this row's maximum / (1 - e)
    let bound = 0;
    for (const r of rows) {
      let top = 0;
      for (let j = 0; j < out.length; j++) { out[j] += r.row[j]; if (r.row[j] > top) top = r.row[j]; }
      bound += r.error * top / (1 - r.error) / rows.length;
    }
    for (let j = 0; j < out.length; j++) out[j] /= rows.length;
    return {row: Array.from(out), bound: bound};
  }
  const [, , Tq, Tk] = layer.codes.shape;
  const codes = view(layer.codes), steps = view(layer.steps);
  const out = new Float64Array(Tk);
  let bound = 0;
  for (const k of slots) {
    const base = ((image * H + k) * Tq + row), step = steps[base];
    bound = Math.max(bound, step / 2);
    for (let j = 0; j < Tk; j++) {
      const c = codes[base * Tk + j];
      if (c > 0) out[j] += (c - 0.5) * step;
    }
  }
  for (let j = 0; j < Tk; j++) out[j] /= slots.length;
  return {row: Array.from(out), bound: bound};
}
// per grid cell (null: not a key of this query) and per prefix token, the values drawn
function cellsOf(layer, values, row) {
  const g = layer.geometry, n = g.grid[0] * g.grid[1];
  if (g.kind === 'plain') return {cells: values.slice(g.prefix, g.prefix + n), prefix: values.slice(0, g.prefix)};
  const cells = new Array(n).fill(null);
  if (g.kind === 'window') {
    const keys = view(layer.arrays.key_cells), area = layer.arrays.key_cells.shape[1];
    for (let a = 0; a < area; a++) { const cell = keys[row * area + a]; if (cell >= 0) cells[cell] = values[a]; }
  }
  return {cells: cells, prefix: []};
}
function selection(m) {
  const layer = layerOf(m), slot = headSlot(layer);
  const query = state.cls && hasCls(layer) ? 'cls' : queryCell(layer, state.hover || state.point);
  const row = canonicalRow(layer, query);
  const {row: values, bound} = rowValues(layer, state.image, slot, row);
  const drawn = cellsOf(layer, values, row);
  return {layer, slot, query, row, values, bound, drawn};
}
