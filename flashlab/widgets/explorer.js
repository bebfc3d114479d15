// (No "{name}" directly before a backtick here: that reads as a MyST role in a stored output,
// tests/test_raw_markers.py.)
// flashlab explorers: draw precomputed states (flashlab/widgets/explorer.py). Nothing here computes
// a walk, a schedule, a mask or a roofline: every rectangle and every number comes from the state
// that Python computed; this file only turns states into SVG and wires the page's controls to them.
(function () {
  if (window.flashlabExplorer) return;
  const NS = 'http://www.w3.org/2000/svg';
  const esc = s => String(s).replace(/[&<>"]/g, c => ({'&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;'}[c]));
  const rect = (x, y, w, h, attrs) => `<rect x="${x}" y="${y}" width="${w}" height="${h}" ${attrs || ''}/>`;
  const text = (x, y, s, attrs) => `<text x="${x}" y="${y}" ${attrs || ''}>${esc(s)}</text>`;
  const svg = (w, h, body, label) =>
    `<svg xmlns="${NS}" viewBox="0 0 ${w} ${h}" width="${w}" height="${h}" role="img" aria-label="${esc(label)}" style="max-width:100%;height:auto;font:11px sans-serif">${body}</svg>`;
  const COLORS = {empty: '#EEEEEE', partial: '#E69F00', full: '#0072B2', highlight: '#CC79A7',
                  masked: '#BBBBBB', text: '#222222', grid: '#CCCCCC', memory: '#D55E00', compute: '#0072B2'};
  const CLASS_COLOR = [COLORS.empty, COLORS.partial, COLORS.full];

  // a "nice" tick step for an axis from 0 to hi
  function ticks(hi, n) {
    const raw = hi / n, p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map(m => m * p).find(s => s >= raw);
    const out = [];
    for (let t = 0; t <= hi + 1e-9; t += step) out.push(t);
    return out;
  }

  // ---------------------------------------------------------------- a grid of entries and tiles
  // mask: rows of '1' (allowed) / '0' (masked out); tiles: [i0, i1, j0, j1, cls]; cls 0 empty
  // (skipped), 1 partial, 2 full. Masked entries are drawn as runs along each row.
  function entryGrid(sq, sk, mask, tiles, opts) {
    const cell = Math.max(3, Math.min(28, Math.floor(440 / Math.max(sq, sk))));
    // wide enough for the four legend entries under the grid (120 px each) however small the grid
    const x0 = 46, y0 = 34, W = Math.max(x0 + sk * cell + 20, x0 + 4 * 120), H = y0 + sq * cell + 40;
    let b = rect(x0, y0, sk * cell, sq * cell, 'fill="#FFFFFF" stroke="#999"');
    mask.forEach((row, i) => {
      let j = 0;
      while (j < sk) {
        if (row[j] === '0') {
          let e = j;
          while (e < sk && row[e] === '0') e++;
          b += rect(x0 + j * cell, y0 + i * cell, (e - j) * cell, cell, `fill="${COLORS.masked}"`);
          j = e;
        } else j++;
      }
    });
    tiles.forEach((t, k) => {
      const [i0, i1, j0, j1, cls] = t;
      const done = opts.done ? opts.done(k) : false;
      const fill = done ? `fill="${CLASS_COLOR[cls]}" fill-opacity="${cls ? 0.35 : 0.5}"` : 'fill="none"';
      const dash = cls === 0 ? 'stroke-dasharray="4 3"' : '';
      b += rect(x0 + j0 * cell, y0 + i0 * cell, (j1 - j0) * cell, (i1 - i0) * cell,
                `${fill} stroke="${cls === 0 ? '#888' : CLASS_COLOR[cls]}" stroke-width="1.5" ` + dash);
    });
    if (opts.current !== undefined) {
      const [i0, i1, j0, j1] = tiles[opts.current];
      // the q-block's rows and the k-block's keys, marked on the axes
      b += rect(x0 - 10, y0 + i0 * cell, 7, (i1 - i0) * cell, 'fill="#0072B2"');
      b += rect(x0 + j0 * cell, y0 - 10, (j1 - j0) * cell, 7, 'fill="#D55E00"');
      b += rect(x0 + j0 * cell, y0 + i0 * cell, (j1 - j0) * cell, (i1 - i0) * cell,
                `fill="none" stroke="${COLORS.highlight}" stroke-width="4"`);
    }
    (opts.lines || []).forEach(([kind, at]) => {
      b += kind === 'row'
        ? `<line x1="${x0}" x2="${x0 + sk * cell}" y1="${y0 + at * cell}" y2="${y0 + at * cell}" stroke="${COLORS.highlight}" stroke-width="2"/>`
        : `<line y1="${y0}" y2="${y0 + sq * cell}" x1="${x0 + at * cell}" x2="${x0 + at * cell}" stroke="${COLORS.highlight}" stroke-width="2"/>`;
    });
    b += text(x0, y0 - 16, `keys j = 0..${sk - 1} →`, 'fill="#D55E00"');
    b += text(4, y0 + 10, 'query', `fill="${COLORS.text}"`) + text(4, y0 + 22, 'i ↓', `fill="${COLORS.text}"`);
    const ly = y0 + sq * cell + 18;
    const legend = [[COLORS.full, 'full tile'], [COLORS.partial, 'partial tile'], ['#888', 'skipped tile (dashed)'],
                    [COLORS.masked, 'masked entry']];
    legend.forEach(([c, s], k) => {
      b += rect(x0 + k * 120, ly - 9, 10, 10, `fill="${c}"`) + text(x0 + k * 120 + 14, ly, s);
    });
    return [W, H, b];
  }

  const renderers = {
    tiles(st, frame, pool) {
      const [W, H, b] = entryGrid(st.sq, st.sk, pool[st.mask], st.tiles,
                                  {current: frame, done: k => k < frame});
      return svg(W, H, b, `tile walk, step ${frame + 1} of ${st.tiles.length}`);
    },
    sparse(st, frame, pool) {
      if (st.error) {
        const b = rect(0, 0, 560, 70, 'fill="#FFF3F0" stroke="#D55E00"') +
                  text(12, 26, 'the device rejects these arguments:', 'font-weight="bold" fill="#D55E00"') +
                  text(12, 48, 'see the message below');
        return svg(560, 70, b, 'rejected by the operator');
      }
      const lines = (st.qends || []).map(e => ['row', e]).concat((st.kends || []).map(e => ['col', e]));
      const [W, H, b] = entryGrid(st.sq, st.sk, pool[st.mask], st.tiles, {done: () => true, lines});
      return svg(W, H, b, 'the mask the operator applies and its tiles');
    },
    pipeline(st, frame, pool) {
      if (st.error) {
        const b = rect(0, 0, 640, 60, 'fill="#FFF3F0" stroke="#D55E00"') +
                  text(12, 26, 'this configuration cannot run (see below)', 'font-weight="bold" fill="#D55E00"');
        return svg(640, 60, b, 'configuration that cannot run');
      }
      const lane = 20, x0 = 92, plotW = 600, y0 = 22, T = st.T;
      const H = y0 + st.lanes.length * lane + 58, W = x0 + plotW + 16;
      const x = t => x0 + plotW * t / T;
      let b = '';
      const tk = ticks(T / st.scale, 6);
      tk.forEach(t => {
        const xt = x(t * st.scale);
        b += `<line x1="${xt}" x2="${xt}" y1="${y0}" y2="${y0 + st.lanes.length * lane}" stroke="${COLORS.grid}"/>`;
        b += text(xt, y0 + st.lanes.length * lane + 14, +t.toFixed(3), 'text-anchor="middle"');
      });
      b += text(x0 + plotW / 2, y0 + st.lanes.length * lane + 28, `time (${st.unit})`, 'text-anchor="middle"');
      st.lanes.forEach((name, k) => {
        const crit = k === st.crit;
        b += text(x0 - 6, y0 + k * lane + 14, name, `text-anchor="end" ${crit ? `fill="${COLORS.highlight}" font-weight="bold"` : ''}`);
      });
      b += `<line x1="${x0}" x2="${x0 + plotW}" y1="${y0 + st.engines * lane}" y2="${y0 + st.engines * lane}" stroke="#999"/>`;
      st.bars.forEach(([k, s, e, c, name]) => {
        const w = Math.max(0.5, x(e) - x(s));
        b += rect(x(s).toFixed(1), y0 + k * lane + 3, w.toFixed(1), lane - 6,
                  `fill="${pool[st.colors][c]}" ${k >= st.engines ? 'fill-opacity="0.55"' : ''} stroke="#fff" stroke-width="0.4"`);
        if (w > 34 && name) b += text((x(s) + w / 2).toFixed(1), y0 + k * lane + 14, name, 'text-anchor="middle" font-size="9"');
      });
      (st.gaps || []).forEach(([s, e]) => {
        b += rect(x(s).toFixed(1), y0 + st.crit * lane + 2, Math.max(0.5, x(e) - x(s)).toFixed(1), lane - 4,
                  `fill="url(#fxhatch)" stroke="${COLORS.highlight}" stroke-width="0.8"`);
      });
      const defs = `<defs><pattern id="fxhatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="${COLORS.highlight}" stroke-width="1.5"/></pattern></defs>`;
      const ly = y0 + st.lanes.length * lane + 46;
      let lx = 4;
      pool[st.legend].forEach(([c, s]) => {
        b += rect(lx, ly - 9, 10, 10, `fill="${c}"`) + text(lx + 13, ly, s);
        lx += 20 + 6 * s.length;
      });
      b += text(x0, 14, `critical engine ${st.lanes[st.crit]}: its idle gaps hatched`, `fill="${COLORS.highlight}"`);
      return svg(Math.max(W, lx), H, defs + b, 'Gantt chart of the modelled pipeline');
    },
    roofline(st, frame, pool) {
      // log-log axes: intensity (FLOP/byte) to the right, attainable FLOP/s upwards
      const x0 = 70, y0 = 16, w = 520, h = 300;
      const [ilo, ihi] = st.xrange, [plo, phi] = st.yrange;
      const X = i => x0 + w * Math.log10(i / ilo) / Math.log10(ihi / ilo);
      const Y = p => y0 + h - h * Math.log10(p / plo) / Math.log10(phi / plo);
      let b = rect(x0, y0, w, h, 'fill="#FFFFFF" stroke="#999"');
      for (let e = Math.ceil(Math.log10(ilo)); e <= Math.log10(ihi); e++) {
        b += `<line x1="${X(10 ** e)}" x2="${X(10 ** e)}" y1="${y0}" y2="${y0 + h}" stroke="${COLORS.grid}"/>` +
             text(X(10 ** e), y0 + h + 14, '1e' + e, 'text-anchor="middle"');
      }
      for (let e = Math.ceil(Math.log10(plo)); e <= Math.log10(phi); e++) {
        b += `<line x1="${x0}" x2="${x0 + w}" y1="${Y(10 ** e)}" y2="${Y(10 ** e)}" stroke="${COLORS.grid}"/>` +
             text(x0 - 4, Y(10 ** e) + 4, '1e' + e, 'text-anchor="end"');
      }
      const roof = [[ilo, st.bw * ilo], [st.ridge, st.peak], [ihi, st.peak]];
      b += `<polyline points="${roof.map(([i, p]) => `${X(i).toFixed(1)},${Y(p).toFixed(1)}`).join(' ')}" fill="none" stroke="#222" stroke-width="2"/>`;
      b += `<line x1="${X(st.ridge)}" x2="${X(st.ridge)}" y1="${y0}" y2="${y0 + h}" stroke="#222" stroke-dasharray="3 3"/>` +
           text(X(st.ridge) + 4, y0 + 12, `ridge ${st.ridge_label}`);
      b += `<polyline points="${st.sweep.map(([i, p]) => `${X(i).toFixed(1)},${Y(p).toFixed(1)}`).join(' ')}" fill="none" stroke="#999" stroke-dasharray="2 2"/>`;
      st.sweep.forEach(([i, p]) => { b += `<circle cx="${X(i).toFixed(1)}" cy="${Y(p).toFixed(1)}" r="2.5" fill="#999"/>`; });
      const colour = st.bound === 'memory' ? COLORS.memory : COLORS.compute;
      b += `<circle cx="${X(st.point[0]).toFixed(1)}" cy="${Y(st.point[1]).toFixed(1)}" r="7" fill="${colour}" stroke="#000"/>`;
      b += text(x0 + w / 2, y0 + h + 30, 'arithmetic intensity (FLOP/byte)', 'text-anchor="middle"');
      b += `<text transform="translate(14 ${y0 + h / 2}) rotate(-90)" text-anchor="middle">attainable FLOP/s</text>`;
      b += text(x0 + 8, y0 + h - 8, `${st.chip}: the forward kernel (dot), the hit rates 0..1 (grey)`, `fill="${colour}"`);
      return svg(x0 + w + 20, y0 + h + 40, b, `roofline of ${st.chip}`);
    },
  };

  async function decode(b64) {
    const bytes = Uint8Array.from(atob(b64), c => c.charCodeAt(0));
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
    return JSON.parse(await new Response(stream).text());
  }

  function control(root, spec, index, onChange) {
    const wrap = document.createElement('label');
    wrap.className = 'fx-control';
    wrap.style.cssText = 'display:inline-flex;align-items:center;gap:4px;margin:2px 12px 2px 0';
    wrap.append(spec.label + ' ');
    const numeric = spec.values.every(v => typeof v === 'number') && spec.values.length > 2;
    let input;
    if (numeric) {
      input = document.createElement('input');
      input.type = 'range'; input.min = 0; input.max = spec.values.length - 1; input.step = 1;
      input.value = index;
      const out = document.createElement('output');
      out.textContent = spec.values[index];
      input.addEventListener('input', () => { out.textContent = spec.values[+input.value]; onChange(+input.value); });
      wrap.append(input, out);
    } else {
      input = document.createElement('select');
      spec.values.forEach((v, k) => { const o = document.createElement('option'); o.value = k; o.textContent = v; input.append(o); });
      input.value = index;
      input.addEventListener('change', () => onChange(+input.value));
      wrap.append(input);
    }
    input.dataset.name = spec.name;
    return [wrap, input];
  }

  function boot(uid) {
    const root = document.getElementById(uid);
    if (!root || root.fx) return;
    root.dataset.bootMs = performance.now().toFixed(1);
    const data = root.querySelector('.fx-data').textContent.trim();
    decode(data).then(payload => start(root, payload)).catch(err => {
      root.querySelector('.fx-numbers').textContent = 'explorer failed to load: ' + err;
      console.error(err);
    });
  }

  function start(root, payload) {
    const picture = root.querySelector('.fx-picture'), numbers = root.querySelector('.fx-numbers');
    const controls = root.querySelector('.fx-controls');
    const idx = payload.init.slice();
    let frame = 0, timer = null;
    const inputs = {};
    const stateIndex = () => {
      let k = 0;
      payload.controls.forEach((c, n) => { k = k * c.values.length + idx[n]; });
      return payload.lookup[k];
    };
    // the step controls of a state with frames
    const stepBox = document.createElement('div');
    stepBox.className = 'fx-steps';
    stepBox.style.cssText = 'display:flex;flex-wrap:wrap;align-items:center;gap:6px;margin:4px 0';
    const mk = (tag, props) => Object.assign(document.createElement(tag), props);
    const play = mk('button', {type: 'button', textContent: '▶ play', className: 'fx-play'});
    const prev = mk('button', {type: 'button', textContent: '◀ prev', className: 'fx-prev'});
    const next = mk('button', {type: 'button', textContent: 'next ▶', className: 'fx-next'});
    const step = mk('input', {type: 'range', min: 0, max: 0, step: 1, value: 0, className: 'fx-step'});
    step.dataset.name = 'step';
    const stepOut = mk('output', {});
    stepBox.append(play, prev, next, 'step ', step, stepOut);

    function draw() {
      const st = payload.states[stateIndex()];
      const n = st.frames ? st.frames.length : 0;
      frame = Math.min(frame, Math.max(0, n - 1));
      stepBox.style.display = n ? 'flex' : 'none';
      step.max = Math.max(0, n - 1); step.value = frame;
      stepOut.textContent = n ? (frame + 1) + ' / ' + n : '';
      picture.innerHTML = renderers[payload.kind](st, frame, payload.pool);
      const lines = st.text.concat(n ? st.frames[frame].text : []);
      numbers.innerHTML = lines.map(s => `<div>${esc(s)}</div>`).join('');
      const off = new Set(st.off || []);
      for (const [name, input] of Object.entries(inputs)) input.disabled = off.has(name);
    }
    payload.controls.forEach((c, n) => {
      if (c.values.length < 2) return;
      const [wrap, input] = control(root, c, idx[n], k => { idx[n] = k; frame = 0; draw(); });
      inputs[c.name] = input;
      controls.append(wrap);
    });
    controls.append(stepBox);
    const stop = () => { if (timer) { clearInterval(timer); timer = null; play.textContent = '▶ play'; } };
    step.addEventListener('input', () => { stop(); frame = +step.value; draw(); });
    prev.addEventListener('click', () => { stop(); frame = Math.max(0, frame - 1); draw(); });
    next.addEventListener('click', () => { stop(); frame = Math.min(+step.max, frame + 1); draw(); });
    play.addEventListener('click', () => {
      if (timer) return stop();
      play.textContent = '❚❚ pause';
      if (frame >= +step.max) frame = 0;
      timer = setInterval(() => { if (frame >= +step.max) return stop(); frame++; draw(); }, payload.interval || 600);
    });
    // the page's test hooks (tools/check_site.py): the values shown, and the grid's size
    root.fx = {
      payload, inputs, picture, numbers, step,
      // go to grid indices (one per control) and a step, as a reader would with the controls
      set: (indices, k) => {
        indices.forEach((v, n) => { idx[n] = v; });
        payload.controls.forEach((c, n) => {
          const input = inputs[c.name];
          if (!input) return;
          input.value = idx[n];
          const out = input.parentElement.querySelector('output');
          if (out) out.textContent = c.values[idx[n]];
        });
        frame = k || 0;
        draw();
      },
      current: () => {
        const values = {};
        payload.controls.forEach((c, n) => { values[c.name] = c.values[idx[n]]; });
        return {values, frame, state: stateIndex()};
      },
    };
    draw();
    root.dataset.readyMs = performance.now().toFixed(1);
  }

  window.flashlabExplorer = {boot, renderers, decode};
})();
