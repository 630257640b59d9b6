// vitscope explorer, part 5 of 5: window.vitscope (select, current, figure, ready; docs/explore.md), PNG
// export and start-up.
// ---------- API ----------
function current() {
  return {
    image: state.image, layer: layerOf(models()[0]).number, head: state.head === 'mean' ? 'mean' : state.head + 1,
    view: state.view, maxError: META.max_error,
    models: models().map((m) => {
      const sel = selection(m);
      let hottest = -1, best = -1;
      sel.drawn.cells.forEach((v, i) => { if (v !== null && v > best) { best = v; hottest = i; } });
      return {label: m.label, layer: sel.layer.number, head: sel.slot < 0 ? 'mean' : sel.layer.heads[sel.slot] + 1,
        grid: sel.layer.geometry.grid, kind: sel.layer.geometry.kind, form: sel.layer.form, query: sel.query, row: sel.values,
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
  $('vs-summary').textContent = `${META.images.length} images · ${models().map((m) => m.label).join(' vs ')}`;
  const n = $('vs-notes');
  [META.precision.text, META.quantization.text, META.notes].forEach((text) => { if (text) n.append(el('p', {}, text)); });
  n.append(el('p', {}, 'MAD: mean attention distance of patch queries over patch keys, rows renormalised, divided by ' +
    'the largest distance (0 = self, 1 = farthest); entropy: row entropy over patch keys divided by log(keys); ' +
    'set = mean over the images with patch mass (docs/definitions.md). Token norms: L2 norm of each block output ' +
    'before the final norm. Layers and heads are numbered from 1. Script this page with ' +
    'window.vitscope.select({image, layer, head, query}) and window.vitscope.current() (docs/explore.md).'));
}
async function start() {
  models().forEach((m, mi) => m.layers.forEach((l, li) => { l.uid = `${mi}.${li}`; }));
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
// normalize({kind, alpha}, logits): the page's normaliser on one row of logits (for tests and scripts)
const normalize = (spec, logits) => Array.from(normalizeRow(spec, Float64Array.from(logits), 0));
const api = {select, current, figure, normalize, patchShare, meta: META, colormap: LUT, zeroColour: ZERO, size: SIZE};
api.ready = start().catch((err) => {
  document.body.prepend(el('p', {class: 'vs-error'}, 'vitscope explorer could not start: ' + err));
  document.body.dataset.ready = 'error';
  throw err;
});
window.vitscope = api;
