// vitscope explorer, part 1 of 4 (vitscope.explorer.page joins the parts inside one function scope):
// the payload, the selection state and the dequantised rows.
const META = JSON.parse(document.getElementById('vitscope-meta').textContent);
const SIZE = 288, SMALL = 92;
const LUT = META.colormap, ZERO = META.zero_colour;
const state = {image: 0, layer: 0, head: 'mean', cls: false, point: {x: 0.5, y: 0.5}, hover: null,
  view: 'attention', scale: 'row', alpha: 0.6};
let BUF = null;
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
async function decode() {
  const text = document.getElementById('vitscope-blob').textContent.trim();
  const raw = atob(text);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
  BUF = await new Response(stream).arrayBuffer();
}
function view(ref) {
  if (!views.has(ref)) {
    const T = {uint8: Uint8Array, int32: Int32Array, float32: Float32Array}[ref.dtype];
    views.set(ref, new T(BUF, ref.offset, ref.length));
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
function rowValues(layer, image, slot, row) {  // dequantised probabilities over the row's keys
  const [, H, Tq, Tk] = layer.codes.shape;
  const codes = view(layer.codes), steps = view(layer.steps);
  const slots = slot < 0 ? [...Array(H).keys()] : [slot];
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
