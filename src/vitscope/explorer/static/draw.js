// vitscope explorer, part 3 of 5: drawing heat maps, norms, outlines and colour bars on canvases.
// ---------- drawing ----------
function colour(t) {
  const i = Math.max(0, Math.min(255, Math.floor(t * 255.999)));
  return LUT[i];
}
const rgb = (c) => `rgb(${c[0]},${c[1]},${c[2]})`;
function cellRect(g, cell, side) {
  const [gh, gw] = g.grid, r = Math.floor(cell / gw), c = cell % gw;
  const x0 = Math.round(c * side / gw), y0 = Math.round(r * side / gh);
  return [x0, y0, Math.round((c + 1) * side / gw) - x0, Math.round((r + 1) * side / gh) - y0];
}
const scaledPictures = new Map();  // the pictures drawn once at each side the page uses
function drawPicture(ctx, side) {
  const key = `${state.image}|${side}`;
  if (!scaledPictures.has(key)) {
    const img = pictures[state.image], canvas = el('canvas', {width: side, height: side}), c = canvas.getContext('2d');
    c.imageSmoothingEnabled = img.naturalWidth >= 96;
    c.drawImage(img, 0, 0, side, side);
    scaledPictures.set(key, canvas);
  }
  ctx.drawImage(scaledPictures.get(key), 0, 0);
}
let sharedMax = null;  // colour scale 'shared': the largest value drawn in any model's main view
function vmaxOf(values) {
  if (state.scale === 'one') return 1;
  if (state.scale === 'shared' && sharedMax !== null) return sharedMax;
  let v = 0;
  values.forEach((x) => { if (x !== null && x > v) v = x; });
  return v > 0 ? v : 1;
}
function fillValue(ctx, x, y, w, h, value, vmax) {
  ctx.fillStyle = rgb(value === 0 ? ZERO : colour(value / vmax));
  ctx.fillRect(x, y, w, h);
}
function drawHeat(ctx, layer, sel, side) {  // attention of the query over the key cells
  ctx.clearRect(0, 0, side, side);
  const g = layer.geometry;
  if (g.kind === 'reduced') {
    const boxes = view(layer.arrays.key_boxes), vmax = vmaxOf(sel.values);
    sel.values.forEach((v, j) => {
      const x0 = Math.round(boxes[4 * j + 1] * side), y0 = Math.round(boxes[4 * j] * side);
      fillValue(ctx, x0, y0, Math.round(boxes[4 * j + 3] * side) - x0, Math.round(boxes[4 * j + 2] * side) - y0, v, vmax);
    });
    return vmax;
  }
  // one pixel per grid cell, scaled up without smoothing: every cell in its exact colour, cells outside a Swin window
  // transparent
  const vmax = vmaxOf(sel.drawn.cells), [gh, gw] = g.grid, pixels = new ImageData(gw, gh);
  sel.drawn.cells.forEach((v, cell) => {
    if (v === null) return;
    const c = v === 0 ? ZERO : colour(v / vmax);
    pixels.data[4 * cell] = c[0]; pixels.data[4 * cell + 1] = c[1]; pixels.data[4 * cell + 2] = c[2]; pixels.data[4 * cell + 3] = 255;
  });
  cellCanvas.width = gw; cellCanvas.height = gh;
  cellCanvas.getContext('2d').putImageData(pixels, 0, 0);
  ctx.imageSmoothingEnabled = false;
  ctx.drawImage(cellCanvas, 0, 0, side, side);
  return vmax;
}
const cellCanvas = document.createElement('canvas');
function normsOf(layer) {
  const [, T] = layer.norms.shape, all = view(layer.norms), base = state.image * T;
  return Array.from(all.subarray(base, base + T));
}
function drawNorms(ctx, m, layer, side) {
  ctx.clearRect(0, 0, side, side);
  const g = layer.geometry, norms = normsOf(layer).slice(g.prefix);
  const lo = Math.min(...norms), hi = Math.max(...norms);
  norms.forEach((v, cell) => {
    ctx.fillStyle = rgb(colour(hi > lo ? (v - lo) / (hi - lo) : 0));
    ctx.fillRect(...cellRect(g, cell, side));
  });
  return [lo, hi];
}
function outline(ctx, g, cells, side, style, width) {  // the boundary of a set of grid cells
  const [gh, gw] = g.grid, inside = new Set(cells);
  ctx.strokeStyle = style; ctx.lineWidth = width; ctx.beginPath();
  for (const cell of cells) {
    const [x, y, w, h] = cellRect(g, cell, side), r = Math.floor(cell / gw), c = cell % gw;
    if (r === 0 || !inside.has(cell - gw)) { ctx.moveTo(x, y); ctx.lineTo(x + w, y); }
    if (r === gh - 1 || !inside.has(cell + gw)) { ctx.moveTo(x, y + h); ctx.lineTo(x + w, y + h); }
    if (c === 0 || !inside.has(cell - 1)) { ctx.moveTo(x, y); ctx.lineTo(x, y + h); }
    if (c === gw - 1 || !inside.has(cell + 1)) { ctx.moveTo(x + w, y); ctx.lineTo(x + w, y + h); }
  }
  ctx.stroke();
}
function drawOverlay(ctx, m, layer, sel, side) {
  ctx.clearRect(0, 0, side, side);
  const g = layer.geometry, [gh, gw] = g.grid;
  if (gh <= 32 && gw <= 32) {
    ctx.strokeStyle = 'rgba(255,255,255,0.28)'; ctx.lineWidth = 1; ctx.beginPath();
    for (let r = 1; r < gh; r++) { const y = Math.round(r * side / gh) + 0.5; ctx.moveTo(0, y); ctx.lineTo(side, y); }
    for (let c = 1; c < gw; c++) { const x = Math.round(c * side / gw) + 0.5; ctx.moveTo(x, 0); ctx.lineTo(x, side); }
    ctx.stroke();
  }
  if (g.kind === 'reduced' && state.view !== 'norms') {  // the reduced keys' cells
    const boxes = view(layer.arrays.key_boxes);
    ctx.strokeStyle = 'rgba(255,255,255,0.7)'; ctx.lineWidth = 1; ctx.beginPath();
    for (let j = 0; j < g.keys; j++) {
      ctx.rect(Math.round(boxes[4 * j + 1] * side) + 0.5, Math.round(boxes[4 * j] * side) + 0.5,
        Math.round((boxes[4 * j + 3] - boxes[4 * j + 1]) * side) - 1, Math.round((boxes[4 * j + 2] - boxes[4 * j]) * side) - 1);
    }
    ctx.stroke();
  }
  if (state.view === 'norms') {
    const t = m.threshold.value, norms = normsOf(layer).slice(g.prefix);
    outline(ctx, g, norms.map((v, i) => v > t ? i : -1).filter((i) => i >= 0), side, '#ff2d2d', 2);
    return;
  }
  if (g.kind === 'window') {
    const cells = sel.drawn.cells.map((v, i) => v === null ? -1 : i).filter((i) => i >= 0);
    outline(ctx, g, cells, side, '#ffffff', 2);
  }
  hatchZeros(ctx, layer, sel, side);
  if (sel.query !== 'cls') outline(ctx, g, [sel.query], side, '#ff2d2d', 2.5);
}
function hatchZeros(ctx, layer, sel, side) {  // exact zeros: hatched on top, whatever the overlay's opacity
  const g = layer.geometry, rects = [];
  if (g.kind === 'reduced') {
    const boxes = view(layer.arrays.key_boxes);
    sel.values.forEach((v, j) => { if (v === 0) rects.push([boxes[4 * j + 1] * side, boxes[4 * j] * side, (boxes[4 * j + 3] - boxes[4 * j + 1]) * side, (boxes[4 * j + 2] - boxes[4 * j]) * side]); });
  } else sel.drawn.cells.forEach((v, cell) => { if (v === 0) rects.push(cellRect(g, cell, side)); });
  if (!rects.length) return;
  ctx.save(); ctx.strokeStyle = 'rgba(235,235,235,0.95)'; ctx.lineWidth = 1; ctx.beginPath();
  for (const [x, y, w, h] of rects) {
    ctx.rect(x + 0.5, y + 0.5, w - 1, h - 1);
    ctx.moveTo(x + 1, y + h - 1); ctx.lineTo(x + w - 1, y + 1);
  }
  ctx.stroke(); ctx.restore();
}
function drawBar(canvas, lo, hi) {
  const ctx = canvas.getContext('2d');
  for (let x = 0; x < canvas.width; x++) { ctx.fillStyle = rgb(colour(x / (canvas.width - 1))); ctx.fillRect(x, 0, 1, canvas.height); }
  canvas.title = `${lo} to ${hi}`;
}
