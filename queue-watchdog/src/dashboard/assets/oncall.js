// queue dashboard, on-call tools: bulk replay / purge of the dead letters a
// filter selects, in two steps (preview shows the count; the action sends the
// confirmed count and selection back and the server refuses when the set
// changed).
// Server data goes in with textContent only.
(function () {
  'use strict';
  var state = { previews: 0, bulk: null };
  window.oncallState = state;
  var box = document.getElementById('bulk');
  if (!box) { state.ready = true; return; }
  var q = encodeURIComponent(box.dataset.queue);
  var filter = { type: box.dataset.type || null, contains: box.dataset.contains || null };
  var confirmBox = document.getElementById('bulk-confirm');
  var countText = document.getElementById('bulk-count');
  var result = document.getElementById('bulk-result');
  var previewBtn = document.getElementById('bulk-preview');
  var count = null;
  var selection = null;

  function post(path, body) {
    return fetch('/api/queues/' + q + '/bulk-dead/' + path, {
      method: 'POST', credentials: 'same-origin',
      headers: { 'X-Queue-Dashboard': '1', 'Content-Type': 'application/json' },
      body: JSON.stringify(body)
    }).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (b) { return { ok: r.ok, status: r.status, body: b }; });
    });
  }

  function say(text, cls) { result.textContent = text; result.className = 'result ' + (cls || ''); }

  previewBtn.addEventListener('click', function () {
    previewBtn.disabled = true;
    say('counting…', 'muted');
    post('preview', filter).then(function (r) {
      previewBtn.disabled = false;
      if (!r.ok) { say(r.body.error || ('HTTP ' + r.status), 'bad'); return; }
      count = r.body.count;
      selection = r.body.selection;
      state.previews++;
      say('', '');
      countText.textContent = count + ' of ' + r.body.total + ' dead letters match (' + r.body.filter + ')' +
        (r.body.sample.length ? ', e.g. ' + r.body.sample.join(', ') : '') +
        (r.body.more ? ' (the newest ' + count + ' of more: preview again after acting)' : '') +
        '. Act on all ' + count + '?';
      document.getElementById('bulk-replay').textContent = 'Replay ' + count;
      document.getElementById('bulk-purge').textContent = 'Purge ' + count + ' for good';
      confirmBox.hidden = count === 0;
      if (count === 0) say('Nothing matches.', 'muted');
    }, function (e) { previewBtn.disabled = false; say(String(e), 'bad'); });
  });

  document.getElementById('bulk-cancel').addEventListener('click', function () {
    confirmBox.hidden = true; count = null; say('', '');
  });

  Array.prototype.forEach.call(document.querySelectorAll('button.bulk-act'), function (btn) {
    btn.addEventListener('click', function () {
      if (count === null) return;
      var action = btn.dataset.action;
      var body = { type: filter.type, contains: filter.contains, expect: count, selection: selection };
      confirmBox.hidden = true;
      say(action + ': working on ' + count + ' jobs…', 'muted');
      post(action, body).then(function (r) {
        state.bulk = { action: action, status: r.status, body: r.body };
        // What was done is said in both branches: an action that failed
        // part-way (a failover mid-purge: 502) has still replayed or purged
        // `done` jobs, and the operator must know before trying again.
        var b = r.body || {};
        var did = typeof b.done === 'number'
          ? (action === 'replay' ? 'Replayed ' : 'Purged ') + b.done + ' (' + (b.skipped || 0) + ' had changed meanwhile)'
          : null;
        if (r.ok) {
          say(did + '. Reload to see the list now.', 'good');
        } else {
          say((b.error || ('HTTP ' + r.status)) + (did ? '. Before it stopped: ' + did + '. Reload to see the list now.' : ''), 'bad');
        }
        count = null; selection = null;
      }, function (e) { say(String(e), 'bad'); });
    });
  });
  state.ready = true;
})();
