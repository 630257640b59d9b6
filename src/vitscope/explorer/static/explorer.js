// vitscope explorer: draws the attention and token norms stored in #vitscope-meta and #vitscope-blob.
// API (docs/explore.md): window.vitscope.select({image, layer, head, query}), current(), figure(), ready.
(function () {
  'use strict';
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
  function drawPicture(ctx, side) {
    const img = pictures[state.image];
    ctx.imageSmoothingEnabled = img.naturalWidth >= 96;
    ctx.drawImage(img, 0, 0, side, side);
  }
  function vmaxOf(values) {
    if (state.scale === 'one') return 1;
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
    const vmax = vmaxOf(sel.drawn.cells);
    sel.drawn.cells.forEach((v, cell) => { if (v !== null) fillValue(ctx, ...cellRect(g, cell, side), v, vmax); });
    return vmax;
  }
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

  // ---------- panels ----------
  const panels = [];
  function buildPanels() {
    const host = $('vs-panels');
    models().forEach((m, mi) => {
      const panel = el('div', {class: 'vs-panel', 'data-model': mi});
      panel.append(el('h3', {}, m.label), el('div', {class: 'vs-sub'}));
      const stack = el('div', {class: 'vs-stack'});
      const canvases = ['vs-base', 'vs-heat', 'vs-overlay'].map((cls) => {
        const c = el('canvas', {class: cls, width: SIZE, height: SIZE, 'data-model': mi});
        c.style.width = c.style.height = SIZE + 'px';
        stack.append(c);
        return c;
      });
      const [, heat, overlay] = canvases;
      const point = (ev) => {
        const r = overlay.getBoundingClientRect();
        return {x: (ev.clientX - r.left) / r.width, y: (ev.clientY - r.top) / r.height};
      };
      overlay.addEventListener('mousemove', (ev) => { state.hover = point(ev); renderSoon(); });
      overlay.addEventListener('mouseleave', () => { state.hover = null; render(); });
      overlay.addEventListener('click', (ev) => { state.point = point(ev); state.hover = null; state.cls = false; $('vs-cls').checked = false; render(); });
      panel.append(stack);
      const side = el('div', {class: 'vs-side'});
      const prefix = el('div', {class: 'vs-prefix'});
      side.append(prefix);
      panel.append(side);
      const bar = el('div', {class: 'vs-bar'});
      const barCanvas = el('canvas', {width: 150, height: 10});
      const lo = el('span'), hi = el('span'), zero = el('span', {class: 'vs-zero'}), zeroText = el('span', {}, 'exactly 0');
      zero.style.background = `linear-gradient(135deg, transparent 42%, #ebebeb 42%, #ebebeb 58%, transparent 58%), ${rgb(ZERO)}`;
      bar.append(lo, barCanvas, hi, zero, zeroText);
      panel.append(bar, el('div', {class: 'vs-norm-list'}));
      host.append(panel);
      heat.style.opacity = state.alpha;
      panels.push({panel, canvases, prefix, bar, barCanvas, lo, hi, zero, zeroText});
      drawBar(barCanvas, 0, 1);
    });
  }
  function prefixCells(p, m, layer, sel) {
    p.prefix.replaceChildren();
    const labels = layer.geometry.labels;
    if (!labels.length) return;
    const norms = normsOf(layer);
    const vmax = state.view === 'norms' ? Math.max(...norms) : vmaxOf(sel.drawn.cells.concat(sel.drawn.prefix));
    labels.forEach((label, k) => {
      const cell = el('div', {class: 'vs-cell' + (label === 'CLS' && sel.query === 'cls' ? ' q' : ''), title: label});
      const value = state.view === 'norms' ? norms[k] : sel.drawn.prefix[k];
      const sw = el('div', {class: 'sw'});
      sw.style.background = rgb(value === 0 && state.view !== 'norms' ? ZERO : colour(Math.min(1, value / vmax)));
      cell.append(sw, el('div', {}, label), el('div', {}, state.view === 'norms' ? fmt(value, 1) : fmt(100 * value, 1) + '%'));
      if (label === 'CLS') cell.addEventListener('click', () => { state.cls = !state.cls; $('vs-cls').checked = state.cls; render(); });
      p.prefix.append(cell);
    });
  }
  function renderPanel(p, m, mi) {
    const sel = selection(m), layer = sel.layer, [base, heat, overlay] = p.canvases.map((c) => c.getContext('2d'));
    drawPicture(base, SIZE);
    heat.canvas.style.opacity = state.alpha;
    const ref = layerOf(models()[0]);
    const head = sel.slot < 0 ? 'mean over ' + (layer.heads.length === layer.num_heads ? 'heads' : 'kept heads') : 'head ' + (layer.heads[sel.slot] + 1);
    const matched = mi > 0 && (layer.number / m.depth !== ref.number / models()[0].depth) ? ' (same relative depth)' : '';
    let sub = `layer ${layer.number}/${m.depth}${matched} · ${head} · query ${sel.query === 'cls' ? 'CLS' : 'patch ' + sel.query}`;
    if (state.view === 'norms') {
      const [lo, hi] = drawNorms(heat, m, layer, SIZE);
      p.lo.textContent = fmt(lo, 1); p.hi.textContent = fmt(hi, 1);
      p.zero.style.display = p.zeroText.style.display = 'none';
      const t = m.threshold, norms = normsOf(layer), high = norms.slice(layer.geometry.prefix).filter((v) => v > t.value).length;
      sub = `token norms, output of block ${layer.number}/${m.depth}`;
      p.panel.querySelector('.vs-norm-list').textContent = `high-norm (red): ${high} tokens above ${t.spec} = ${fmt(t.value, 2)} ` +
        `(set on block ${t.detect_layer}'s patch tokens of these images, applied to every layer)`;
    } else {
      const vmax = drawHeat(heat, layer, sel, SIZE);
      p.lo.textContent = '0'; p.hi.textContent = fmt(vmax, 3);
      p.zero.style.display = p.zeroText.style.display = '';
      const zeros = sel.values.filter((v) => v === 0).length;
      const g = layer.geometry, patchMass = g.kind === 'plain' ? sel.drawn.cells.reduce((a, b) => a + b, 0) : 1;
      p.panel.querySelector('.vs-norm-list').textContent = `${zeros} of ${sel.values.length} keys exactly 0` +
        (g.prefix ? ` · patch mass ${fmt(100 * patchMass, 1)}%` : '') +
        (g.kind === 'window' ? ` · window ${g.window.join('x')}, shift ${g.shift.join(',')}` : '') +
        (g.kind === 'reduced' ? ` · ${g.keys} reduced keys` : '') + ` · error ≤ ${sel.bound.toPrecision(2)}`;
    }
    p.panel.querySelector('.vs-sub').textContent = sub;
    drawOverlay(overlay, m, layer, sel, SIZE);
    prefixCells(p, m, layer, sel);
  }
  function renderMultiples() {
    const host = $('vs-multiples-body');
    host.replaceChildren();
    models().forEach((m) => {
      const layer = layerOf(m), row = el('div', {class: 'vs-multi'});
      row.append(el('div', {class: 'lab'}, `${m.label}, layer ${layer.number}`));
      const saved = state.head;
      layer.heads.forEach((h) => {
        state.head = h;
        const sel = selection(m), fig = el('figure', {class: saved === h ? 'on' : ''});
        const canvas = el('canvas', {width: SMALL, height: SMALL});
        const ctx = canvas.getContext('2d');
        drawPicture(ctx, SMALL);
        const heat = el('canvas', {width: SMALL, height: SMALL});
        drawHeat(heat.getContext('2d'), layer, sel, SMALL);
        ctx.globalAlpha = state.alpha; ctx.drawImage(heat, 0, 0); ctx.globalAlpha = 1;
        hatchZeros(ctx, layer, sel, SMALL);
        if (sel.query !== 'cls') outline(ctx, layer.geometry, [sel.query], SMALL, '#ff2d2d', 1.5);
        fig.append(canvas, el('figcaption', {}, `head ${h + 1}`));
        fig.addEventListener('click', () => { state.head = h; render(); });
        row.append(fig);
      });
      state.head = saved;
      host.append(row);
    });
  }
  function scatter(canvas, m, layer) {
    const ctx = canvas.getContext('2d'), W = canvas.width, H = canvas.height, pad = 30;
    ctx.clearRect(0, 0, W, H);
    ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, W, H);
    const X = (v) => pad + v * (W - pad - 8), Y = (v) => H - pad - v * (H - pad - 8);
    ctx.strokeStyle = '#98a2b3'; ctx.beginPath(); ctx.moveTo(pad, 8); ctx.lineTo(pad, H - pad); ctx.lineTo(W - 8, H - pad); ctx.stroke();
    ctx.fillStyle = '#667085'; ctx.font = '11px system-ui';
    ctx.fillText('MAD (set, normalised)', pad + 20, H - 8);
    ctx.save(); ctx.translate(11, H - pad - 10); ctx.rotate(-Math.PI / 2); ctx.fillText('entropy (set)', 0, 0); ctx.restore();
    ctx.fillText('0', pad - 10, H - pad + 12); ctx.fillText('1', W - 14, H - pad + 12); ctx.fillText('1', pad - 10, 14);
    m.layers.forEach((l) => l.heads.forEach((h) => {
      const x = l.mad_set[h], y = l.entropy_set[h];
      if (x === null || y === null) return;
      const current = l === layer;
      ctx.fillStyle = current ? '#1d2330' : 'rgba(102,112,133,0.35)';
      ctx.beginPath(); ctx.arc(X(x), Y(y), current ? 3.5 : 2.5, 0, 7); ctx.fill();
      if (current && (state.head === h)) {
        ctx.strokeStyle = '#d62728'; ctx.lineWidth = 2.5; ctx.beginPath(); ctx.arc(X(x), Y(y), 7, 0, 7); ctx.stroke(); ctx.lineWidth = 1;
      }
    }));
  }
  function renderMetrics() {
    const host = $('vs-metrics-body');
    host.replaceChildren();
    models().forEach((m) => {
      const layer = layerOf(m), block = el('div', {class: 'vs-metric-block'});
      const table = el('table', {class: 'vs-heads'});
      table.append(el('caption', {}, `${m.label}, layer ${layer.number}: this image / all ${META.images.length} images`));
      const head = el('tr');
      ['head', 'MAD image', 'MAD set', 'entropy image', 'entropy set'].forEach((t) => head.append(el('th', {}, t)));
      table.append(head);
      layer.heads.forEach((h) => {
        const tr = el('tr', {class: state.head === h ? 'on' : '', 'data-head': h + 1});
        [String(h + 1), fmt(layer.mad_image[state.image][h]), fmt(layer.mad_set[h]),
          fmt(layer.entropy_image[state.image][h]), fmt(layer.entropy_set[h])].forEach((t) => tr.append(el('td', {}, t)));
        tr.addEventListener('click', () => { state.head = h; render(); });
        table.append(tr);
      });
      const canvas = el('canvas', {width: 280, height: 200, class: 'vs-scatter'});
      scatter(canvas, m, layer);
      block.append(table, canvas);
      host.append(block);
    });
  }
  function renderControls() {
    const ref = layerOf(models()[0]);
    $('vs-layer-label').textContent = `${ref.number} / ${models()[0].depth}`;
    const heads = $('vs-heads');
    heads.replaceChildren();
    const button = (label, value) => {
      const b = el('button', {type: 'button', class: state.head === value ? 'on' : '', 'data-head': value === 'mean' ? 'mean' : value + 1}, label);
      b.addEventListener('click', () => { state.head = value; render(); });
      heads.append(b);
    };
    button('mean', 'mean');
    ref.heads.forEach((h) => button(String(h + 1), h));
    const cls = $('vs-cls');
    cls.disabled = !hasCls(ref);
    document.querySelectorAll('#vs-strip figure').forEach((f, i) => f.classList.toggle('on', i === state.image));
  }
  let pending = 0;
  function renderSoon() {  // hovering: at most one render per frame
    if (!pending) pending = requestAnimationFrame(() => { pending = 0; render(); });
  }
  function render() {
    renderControls();
    models().forEach((m, mi) => renderPanel(panels[mi], m, mi));
    renderMultiples();
    renderMetrics();
  }

  // ---------- API ----------
  function current() {
    return {
      image: state.image, layer: layerOf(models()[0]).number, head: state.head === 'mean' ? 'mean' : state.head + 1,
      view: state.view, maxError: META.quantization.bound,
      models: models().map((m) => {
        const sel = selection(m);
        let hottest = -1, best = -1;
        sel.drawn.cells.forEach((v, i) => { if (v !== null && v > best) { best = v; hottest = i; } });
        return {label: m.label, layer: sel.layer.number, head: sel.slot < 0 ? 'mean' : sel.layer.heads[sel.slot] + 1,
          grid: sel.layer.geometry.grid, kind: sel.layer.geometry.kind, query: sel.query, row: sel.values,
          cells: sel.drawn.cells, prefix: sel.drawn.prefix, labels: sel.layer.geometry.labels, hottest: hottest,
          exactZeros: sel.values.filter((v) => v === 0).length, maxError: sel.bound,
          norms: normsOf(sel.layer), threshold: m.threshold.value,
          highNorm: normsOf(sel.layer).slice(sel.layer.geometry.prefix).map((v, i) => v > m.threshold.value ? i : -1).filter((i) => i >= 0)};
      }),
    };
  }
  function select(opts) {
    opts = opts || {};
    if (opts.image !== undefined) {
      if (!(opts.image >= 0 && opts.image < META.images.length)) throw new Error(`image ${opts.image}: use 0..${META.images.length - 1}`);
      state.image = opts.image;
    }
    const ref = models()[0];
    if (opts.layer !== undefined) {
      const k = ref.layers.findIndex((l) => l.number === opts.layer);
      if (k < 0) throw new Error(`layer ${opts.layer} was not recorded; use one of ${ref.layers.map((l) => l.number).join(', ')}`);
      state.layer = k; $('vs-layer').value = k;
    }
    if (opts.head !== undefined) {
      const heads = layerOf(ref).heads;
      if (opts.head !== 'mean' && heads.indexOf(opts.head - 1) < 0) throw new Error(`head ${opts.head}: use 'mean' or ${heads.map((h) => h + 1).join(', ')}`);
      state.head = opts.head === 'mean' ? 'mean' : opts.head - 1;
    }
    if (opts.query !== undefined) {
      state.hover = null;
      if (opts.query === 'cls') state.cls = true;
      else if (typeof opts.query === 'object') { state.cls = false; state.point = {x: opts.query.x, y: opts.query.y}; }
      else {
        const [gh, gw] = layerOf(ref).geometry.grid;
        if (!(opts.query >= 0 && opts.query < gh * gw)) throw new Error(`query ${opts.query}: use 'cls' or a patch 0..${gh * gw - 1}`);
        state.cls = false; state.point = {x: (opts.query % gw + 0.5) / gw, y: (Math.floor(opts.query / gw) + 0.5) / gh};
      }
      $('vs-cls').checked = state.cls;
    }
    render();
    return current();
  }
  function figure() {  // the current view of every model side by side, as a PNG data URL
    const gap = 16, top = 40, bottom = 26;
    const out = el('canvas', {width: panels.length * (SIZE + gap) + gap, height: SIZE + top + bottom});
    const ctx = out.getContext('2d');
    ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, out.width, out.height);
    panels.forEach((p, i) => {
      const x = gap + i * (SIZE + gap), [base, heat, overlay] = p.canvases;
      ctx.fillStyle = '#1d2330'; ctx.font = '600 13px system-ui'; ctx.fillText(models()[i].label, x, 16);
      ctx.font = '11px system-ui'; ctx.fillStyle = '#667085'; ctx.fillText(p.panel.querySelector('.vs-sub').textContent, x, 32);
      ctx.drawImage(base, x, top); ctx.globalAlpha = state.alpha; ctx.drawImage(heat, x, top); ctx.globalAlpha = 1;
      ctx.drawImage(overlay, x, top);
      ctx.drawImage(p.barCanvas, x, top + SIZE + 8);
      ctx.fillText(p.lo.textContent, x + 156, top + SIZE + 17);
      ctx.fillText(p.hi.textContent, x + 190, top + SIZE + 17);
    });
    return out.toDataURL('image/png');
  }
  function savePng() {
    const a = el('a', {href: figure(), download: `vitscope-image${state.image}-layer${layerOf(models()[0]).number}.png`});
    document.body.append(a); a.click(); a.remove();
  }

  // ---------- start ----------
  function buildStrip() {
    const strip = $('vs-strip');
    META.images.forEach((url, i) => {
      const fig = el('figure', {'data-image': i}), img = el('img', {src: url, alt: META.captions[i]});
      fig.append(img, el('figcaption', {}, META.captions[i]));
      fig.addEventListener('click', () => { state.image = i; render(); });
      strip.append(fig);
    });
  }
  function bindControls() {
    const layer = $('vs-layer');
    layer.max = models()[0].layers.length - 1;
    layer.addEventListener('input', () => { state.layer = Number(layer.value); render(); });
    $('vs-cls').addEventListener('change', (ev) => { state.cls = ev.target.checked; render(); });
    $('vs-view').addEventListener('change', (ev) => { state.view = ev.target.value; render(); });
    $('vs-scale').addEventListener('change', (ev) => { state.scale = ev.target.value; render(); });
    $('vs-alpha').addEventListener('input', (ev) => { state.alpha = Number(ev.target.value) / 100; render(); });
    $('vs-png').addEventListener('click', savePng);
    document.addEventListener('keydown', (ev) => {
      if (ev.target.tagName === 'INPUT' || ev.target.tagName === 'SELECT') return;
      if (ev.key === 'ArrowRight') state.image = Math.min(META.images.length - 1, state.image + 1);
      else if (ev.key === 'ArrowLeft') state.image = Math.max(0, state.image - 1);
      else return;
      render();
    });
  }
  function notes() {
    const q = META.quantization;
    $('vs-summary').textContent = `${META.images.length} images · ${models().map((m) => m.label).join(' vs ')}`;
    const n = $('vs-notes');
    n.append(el('p', {}, q.text));
    n.append(el('p', {}, 'MAD: mean attention distance of patch queries over patch keys, rows renormalised, divided by ' +
      'the largest distance (0 = self, 1 = farthest); entropy: row entropy over patch keys divided by log(keys); ' +
      'set = mean over the images with patch mass (docs/definitions.md). Token norms: L2 norm of each block output ' +
      'before the final norm. Layers and heads are numbered from 1. Script this page with ' +
      'window.vitscope.select({image, layer, head, query}) and window.vitscope.current() (docs/explore.md).'));
  }
  async function start() {
    await decode();
    await Promise.all(META.images.map((url) => new Promise((resolve, reject) => {
      const img = new Image(); img.onload = () => resolve(); img.onerror = reject; img.src = url; pictures.push(img);
    })));
    buildStrip(); bindControls(); notes(); buildPanels();
    if (hasCls(layerOf(models()[0])) === false) $('vs-cls').disabled = true;
    render();
    api.loadMs = performance.now();
    document.body.dataset.ready = '1';
  }
  const api = {select, current, figure, meta: META, colormap: LUT, zeroColour: ZERO, size: SIZE};
  api.ready = start().catch((err) => {
    document.body.prepend(el('p', {class: 'vs-error'}, 'vitscope explorer could not start: ' + err));
    document.body.dataset.ready = 'error';
    throw err;
  });
  window.vitscope = api;
})();
