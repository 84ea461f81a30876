// queue dashboard: live tables, throughput chart, lease countdowns, replay.
// Plain JS, no build step. Everything taken from the server is inserted with
// textContent (never innerHTML): job ids and reasons are user data.
(function () {
  'use strict';
  var page = document.getElementById('page');
  var kind = page ? page.dataset.page : '';
  var state = { chartPoints: 0, polls: 0, lastError: null, replayed: [] };
  window.dashboardState = state;

  function fmtDur(ms) {
    ms = Math.max(0, Math.round(ms));
    var s = Math.floor(ms / 1000);
    if (ms < 1000) return ms + 'ms';
    if (s < 60) return (ms / 1000).toFixed(1) + 's';
    if (s < 3600) return Math.floor(s / 60) + 'm' + String(s % 60).padStart(2, '0') + 's';
    if (s < 86400) return Math.floor(s / 3600) + 'h' + String(Math.floor(s / 60) % 60).padStart(2, '0') + 'm';
    return Math.floor(s / 86400) + 'd' + String(Math.floor(s / 3600) % 24).padStart(2, '0') + 'h';
  }

  function jobHref(queue, id) {
    return '/queues/' + encodeURIComponent(queue) + '/jobs/' + encodeURIComponent(id);
  }

  // ---- replay buttons (queue page and job page) ----
  document.addEventListener('click', function (ev) {
    var btn = ev.target.closest ? ev.target.closest('button.replay') : null;
    if (!btn) return;
    ev.preventDefault();
    btn.disabled = true;
    var result = btn.parentElement.querySelector('.result');
    var url = '/api/queues/' + encodeURIComponent(btn.dataset.queue) + '/dead/' +
      encodeURIComponent(btn.dataset.id) + '/replay';
    fetch(url, { method: 'POST', credentials: 'same-origin', headers: { 'X-Queue-Dashboard': '1' } })
      .then(function (r) {
        return r.json().catch(function () { return {}; }).then(function (body) {
          if (r.ok && body.replayed) {
            btn.textContent = 'Replayed';
            if (result) { result.textContent = 'back in main'; result.className = 'result good'; }
            var row = btn.closest('tr');
            if (row) row.classList.add('replayed');
            state.replayed.push(btn.dataset.id);
          } else {
            btn.disabled = false;
            if (result) { result.textContent = body.error || ('HTTP ' + r.status); result.className = 'result bad'; }
          }
        });
      })
      .catch(function (e) {
        btn.disabled = false;
        if (result) { result.textContent = String(e); result.className = 'result bad'; }
      });
  });

  // ---- pause / resume (queue page) and cancel (job page) ----
  // Same request shape as the replay: POST with the dashboard header.
  function postAction(btn, url, done) {
    btn.disabled = true;
    var result = btn.parentElement.querySelector('.result');
    fetch(url, { method: 'POST', credentials: 'same-origin', headers: { 'X-Queue-Dashboard': '1' } })
      .then(function (r) {
        return r.json().catch(function () { return {}; }).then(function (body) {
          if (r.ok) {
            done(body, result);
          } else {
            btn.disabled = false;
            if (result) { result.textContent = body.message || body.error || ('HTTP ' + r.status); result.className = 'result bad'; }
          }
        });
      })
      .catch(function (e) {
        btn.disabled = false;
        if (result) { result.textContent = String(e); result.className = 'result bad'; }
      });
  }
  state.flow = [];
  state.cancelled = [];
  document.addEventListener('click', function (ev) {
    var btn = ev.target.closest ? ev.target.closest('button.flow, button.cancel') : null;
    if (!btn) return;
    ev.preventDefault();
    var q = encodeURIComponent(btn.dataset.queue);
    if (btn.classList.contains('flow')) {
      postAction(btn, '/api/queues/' + q + '/' + btn.dataset.action, function () {
        state.flow.push(btn.dataset.action);
        window.location.reload();
      });
    } else {
      postAction(btn, '/api/queues/' + q + '/jobs/' + encodeURIComponent(btn.dataset.id) + '/cancel', function (body, result) {
        btn.textContent = 'Cancel sent';
        if (result) { result.textContent = body.message || 'cancelled'; result.className = 'result good'; }
        state.cancelled.push(btn.dataset.id);
      });
    }
  });

  // ---- overview: live table and chart ----
  var COLORS = ['#2563eb', '#16a34a', '#dc2626', '#9333ea', '#ea580c', '#0891b2', '#ca8a04', '#db2777'];

  function setCell(queue, key, text, warn) {
    var cells = document.querySelectorAll('td[data-k="' + key + '"]');
    for (var i = 0; i < cells.length; i++) {
      if (cells[i].dataset.q !== queue) continue;
      cells[i].textContent = text;
      if (warn !== undefined) cells[i].classList.toggle('warn', !!warn);
    }
  }

  function updateTable(queues) {
    queues.forEach(function (q) {
      var c = q.counters || {};
      setCell(q.queue, 'main', String(q.main));
      setCell(q.queue, 'oldest_waiting', q.oldest_waiting_ms == null ? '–' : fmtDur(q.oldest_waiting_ms));
      setCell(q.queue, 'processing', String(q.processing));
      setCell(q.queue, 'expired_leases', String(q.expired_leases), q.expired_leases > 0);
      setCell(q.queue, 'delayed', String(q.delayed));
      setCell(q.queue, 'dead', String(q.dead), q.dead > 0);
      setCell(q.queue, 'completed_last_minute', String(q.completed_last_minute));
      setCell(q.queue, 'retried', String(c.retried || 0));
      setCell(q.queue, 'dead_lettered', String(c.dead || 0));
      setCell(q.queue, 'reclaimed', String(c.reclaimed || 0));
    });
  }

  function drawChart(series) {
    var canvas = document.getElementById('chart');
    if (!canvas) return;
    var dpr = window.devicePixelRatio || 1;
    var w = canvas.clientWidth || 1100, h = canvas.clientHeight || 260;
    canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr);
    var ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    var names = Object.keys(series).sort();
    var tMax = 0, tMin = Infinity, yMax = 0, points = 0;
    names.forEach(function (n) {
      series[n].forEach(function (p) {
        tMax = Math.max(tMax, p[0]); tMin = Math.min(tMin, p[0]);
        yMax = Math.max(yMax, p[1], p[2]);
        points++;
      });
    });
    var left = 48, right = 12, top = 12, bottom = 28;
    var pw = w - left - right, ph = h - top - bottom;
    var span = points ? Math.max(5000, Math.min(600000, tMax - tMin)) : 60000;
    var t0 = tMax - span;
    yMax = niceMax(yMax);
    // grid and labels
    ctx.font = '11px system-ui, sans-serif';
    ctx.fillStyle = '#6b7280'; ctx.strokeStyle = '#e5e7eb'; ctx.lineWidth = 1;
    for (var i = 0; i <= 4; i++) {
      var y = top + ph - (ph * i / 4);
      ctx.beginPath(); ctx.moveTo(left, y); ctx.lineTo(left + pw, y); ctx.stroke();
      ctx.textAlign = 'right'; ctx.textBaseline = 'middle';
      ctx.fillText(formatRate(yMax * i / 4), left - 6, y);
    }
    ctx.textAlign = 'center'; ctx.textBaseline = 'top';
    for (var j = 0; j <= 4; j++) {
      var x = left + pw * j / 4;
      var ago = span * (1 - j / 4);
      ctx.fillText(j === 4 ? 'now' : '-' + fmtDur(ago), x, top + ph + 8);
    }
    if (points === 0) {
      ctx.textAlign = 'center'; ctx.textBaseline = 'middle';
      ctx.fillText('collecting samples…', left + pw / 2, top + ph / 2);
    }
    var legend = document.getElementById('legend');
    if (legend) legend.textContent = '';
    names.forEach(function (n, k) {
      var color = COLORS[k % COLORS.length];
      [[1, []], [2, [5, 4]]].forEach(function (spec) {
        var idx = spec[0];
        ctx.strokeStyle = color; ctx.lineWidth = idx === 1 ? 2 : 1.5; ctx.setLineDash(spec[1]);
        ctx.beginPath();
        var started = false;
        series[n].forEach(function (p) {
          if (p[0] < t0) return;
          var x = left + pw * (p[0] - t0) / span;
          var y = top + ph - ph * (p[idx] / yMax);
          if (!started) { ctx.moveTo(x, y); started = true; } else { ctx.lineTo(x, y); }
        });
        ctx.stroke();
      });
      ctx.setLineDash([]);
      if (legend) {
        var last = series[n].length ? series[n][series[n].length - 1] : null;
        var item = document.createElement('span');
        item.className = 'item';
        var sw = document.createElement('i');
        sw.style.background = color;
        item.appendChild(sw);
        item.appendChild(document.createTextNode(n + (last ? '  ' + formatRate(last[1]) + ' done/s, ' + formatRate(last[2]) + ' in/s' : '')));
        legend.appendChild(item);
      }
    });
    state.chartPoints = points;
    canvas.dataset.points = String(points);
  }

  function niceMax(v) {
    if (v <= 0) return 1;
    var e = Math.pow(10, Math.floor(Math.log10(v)));
    var m = v / e;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * e;
  }

  function formatRate(v) {
    if (v >= 100) return v.toFixed(0);
    if (v >= 10) return v.toFixed(1);
    return v.toFixed(2);
  }

  function pollOverview() {
    var refresh = Number(page.dataset.refresh) || 2000;
    fetch('/api/overview', { headers: { Accept: 'application/json' } })
      .then(function (r) { if (!r.ok) throw new Error('HTTP ' + r.status); return r.json(); })
      .then(function (data) {
        // Rendered while the first queue discovery ran: the rows exist only
        // on a fresh page.
        var d = data.discovery || {};
        if (page.dataset.discovering === 'true' && d.state !== 'in_progress') {
          window.location.reload();
          return;
        }
        updateTable(data.queues || []);
        drawChart(data.series || {});
        state.polls++;
        state.lastError = null;
        var u = document.getElementById('updated');
        if (u) u.textContent = 'Updated ' + new Date().toLocaleTimeString() + '.';
      })
      .catch(function (e) {
        state.lastError = String(e);
        var u = document.getElementById('updated');
        if (u) u.textContent = 'Update failed: ' + e;
      })
      .then(function () { setTimeout(pollOverview, refresh); });
  }

  // ---- queue page: processing table and lease countdowns ----
  var clockOffset = 0; // server clock minus browser clock (ms)

  function leaseText(cell) {
    var until = Number(cell.dataset.leaseUntil);
    if (!until) return;
    var left = until - (Date.now() + clockOffset);
    if (left > 0) {
      cell.textContent = fmtDur(left);
      cell.classList.remove('bad');
    } else {
      cell.textContent = 'expired ' + fmtDur(-left) + ' ago';
      cell.classList.add('bad');
    }
  }

  function tick() {
    var cells = document.querySelectorAll('td.lease[data-lease-until]');
    for (var i = 0; i < cells.length; i++) leaseText(cells[i]);
  }

  function td(text, cls) {
    var c = document.createElement('td');
    if (cls) c.className = cls;
    c.textContent = text;
    return c;
  }

  var STATUS = { running: 'running', expired: 'lost: lease expired', unleased: 'unclaimed: no lease' };

  function renderProcessing(queue, data) {
    var body = document.querySelector('#processing tbody');
    if (!body) return;
    clockOffset = data.now_ms - Date.now();
    body.textContent = '';
    if (!data.jobs.length) {
      var empty = td('No job is being processed.', 'muted');
      empty.colSpan = 6;
      var er = document.createElement('tr');
      er.appendChild(empty);
      body.appendChild(er);
      return;
    }
    data.jobs.forEach(function (j) {
      var tr = document.createElement('tr');
      tr.dataset.id = j.id;
      var idc = document.createElement('td');
      var a = document.createElement('a');
      a.className = 'job'; a.href = jobHref(queue, j.id); a.textContent = j.id;
      idc.appendChild(a);
      tr.appendChild(idc);
      // Fields of a job whose hash is missing come as null.
      var text = function (v) { return v == null ? '' : String(v); };
      // A job key that cannot be read (corrupt data) shows why instead of a type.
      tr.appendChild(j.unreadable ? td(j.unreadable, 'bad') : td(text(j.job_type)));
      tr.appendChild(td(text(j.attempts) + ' / ' + text(j.max_attempts), 'num'));
      tr.appendChild(td(j.delivered_at ? fmtDur(data.now_ms - j.delivered_at) : '–', 'num'));
      var lease = td('no lease', 'num lease muted');
      if (j.lease_until) { lease.className = 'num lease'; lease.dataset.leaseUntil = String(j.lease_until); leaseText(lease); }
      tr.appendChild(lease);
      tr.appendChild(td(STATUS[j.status] || j.status, 'status' + (j.status === 'running' ? '' : ' bad')));
      body.appendChild(tr);
    });
  }

  function pollProcessing(queue) {
    fetch('/api/queues/' + encodeURIComponent(queue) + '/processing', { headers: { Accept: 'application/json' } })
      .then(function (r) { if (!r.ok) throw new Error('HTTP ' + r.status); return r.json(); })
      .then(function (data) { renderProcessing(queue, data); state.polls++; })
      .catch(function (e) { state.lastError = String(e); })
      .then(function () { setTimeout(function () { pollProcessing(queue); }, 2000); });
  }

  if (kind === 'overview') {
    pollOverview();
  } else if (kind === 'queue') {
    clockOffset = (Number(page.dataset.now) || Date.now()) - Date.now();
    setInterval(tick, 250);
    setTimeout(function () { pollProcessing(page.dataset.queue); }, 2000);
  }
  state.ready = true;
})();
