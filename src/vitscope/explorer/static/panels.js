// vitscope explorer, part 4 of 5: the per-model views, small multiples, head tables and scatters, controls.
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
    const g = layer.geometry, patchMass = g.kind === 'plain' ? patchShare(sel.drawn.cells) : 1;
    p.panel.querySelector('.vs-norm-list').textContent = `${zeros} of ${sel.values.length} keys exactly 0` +
      (g.prefix ? ` · patch mass ${fmt(100 * patchMass, 1)}%` : '') +
      (g.kind === 'window' ? ` · window ${g.window.join('x')}, shift ${g.shift.join(',')}` : '') +
      (g.kind === 'reduced' ? ` · ${g.keys} reduced keys` : '') + ` · error ≤ ${sel.bound.toPrecision(2)}`;
  }
  p.panel.querySelector('.vs-sub').textContent = sub;
  drawOverlay(overlay, m, layer, sel, SIZE);
  prefixCells(p, m, layer, sel);
}
// The patch keys' share of a drawn row (cells: the row's patch values): the rounding of stored 8-bit maps can sum a
// hair past 1 (100.2 % was shown); the share is at most the whole row.
function patchShare(cells) {
  return Math.min(1, cells.reduce((a, b) => a + b, 0));
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
  sharedMax = null;
  if (state.scale === 'shared') {
    const rows = models().map((m) => { const sel = selection(m); return layerOf(m).geometry.kind === 'reduced' ? sel.values : sel.drawn.cells; });
    sharedMax = Math.max(1e-12, ...rows.map((r) => r.reduce((a, v) => (v !== null && v > a ? v : a), 0)));
  }
  models().forEach((m, mi) => renderPanel(panels[mi], m, mi));
  renderMultiples();
  renderMetrics();
}
