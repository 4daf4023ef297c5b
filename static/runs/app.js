/* Runsite dashboard: what htmx does not do by itself.
 *
 * - Live updates: htmx's ws extension swaps pushed fragments by id. Here we guard those swaps
 *   (drop a fragment older than what the page shows, re-fetch when the timeline has a gap),
 *   insert rows that are not on the page yet, re-fetch after a reconnect, and poll every 10 s
 *   with a banner while the socket is down. The page acknowledges the frames it has swapped
 *   and painted, so the server sends a page that falls behind fewer, fuller pushes
 *   (runs/consumers.py FLOW_WINDOW) instead of a queue that keeps its clicks waiting.
 * - Relative timestamps, copy buttons, keyboard shortcuts, bulk selection helpers, flashes.
 */
(function () {
  "use strict";

  var body = function () { return document.body; };
  var POLL_MS = 10000;
  var socket = null;        // the ws extension's socket wrapper, once open
  var opened = false;       // the first open is not a reconnect
  var watched = new Set();  // runs whose decided inbox row keeps following the run
  var downTimer = null;
  var received = 0;         // frames of the open socket handed to the page so far
  var ackPending = false;

  // --- live state -----------------------------------------------------------------------

  function setLive(state) {
    body().dataset.live = state;
    var banner = document.getElementById("live-banner");
    if (!banner) return;
    if (state === "down") {
      // A short grace period: a reconnect within a second or two is not worth a banner.
      clearTimeout(downTimer);
      downTimer = setTimeout(function () {
        if (body().dataset.live === "down") banner.hidden = false;
      }, 1500);
    } else {
      clearTimeout(downTimer);
      banner.hidden = true;
    }
  }

  function resync() {
    var el = document.getElementById("resync");
    if (el) htmx.trigger(el, "live:resync");
  }

  function sendWatch(runId) {
    if (!runId) return;
    watched.add(runId);
    if (socket) socket.send(JSON.stringify({ watch: runId }));
  }

  function acknowledge() {
    if (socket) socket.send(JSON.stringify({ ack: received }));
  }

  document.addEventListener("htmx:wsOpen", function (evt) {
    socket = evt.detail.socketWrapper;
    received = 0;
    acknowledge();  // this page acknowledges: the server may hold pushes it is behind on
    setLive("up");
    if (opened) resync();  // messages sent while we were away are lost: re-fetch the regions
    opened = true;
    watched.forEach(function (id) { socket.send(JSON.stringify({ watch: id })); });
  });

  // Counted before the swap (a swap that throws must not stall the socket), acknowledged once
  // the frame after it is painted: a burst of frames is one acknowledgement, and a tab in the
  // background (nothing painted) acknowledges when it is shown again.
  document.addEventListener("htmx:wsBeforeMessage", function () {
    received += 1;
    if (ackPending) return;
    ackPending = true;
    requestAnimationFrame(function () {
      setTimeout(function () { ackPending = false; acknowledge(); }, 0);
    });
  });

  document.addEventListener("htmx:wsClose", function (evt) {
    socket = null;  // a message queued for a closed socket would reach the next one
    setLive("down");
    var code = evt.detail.event && evt.detail.event.code;
    // The extension reconnects by itself after abnormal closes only; a server going away
    // (1000/1001 on restart or deploy) is worth retrying too.
    if ([1006, 1011, 1012, 1013].indexOf(code) < 0 && evt.detail.socketWrapper) {
      setTimeout(function () { evt.detail.socketWrapper.reconnect(); }, 1000 + Math.random() * 2000);
    }
  });

  document.addEventListener("htmx:wsError", function () { setLive("down"); });

  setInterval(function () {
    if (body().dataset.live === "down") resync();
  }, POLL_MS);

  window.addEventListener("pageshow", function (evt) {
    if (evt.persisted) resync();  // restored from the back/forward cache: it is stale
  });

  // --- guarding out-of-band swaps (pushes and htmx responses alike) -------------------------

  function incomingOf(fragment) {
    if (!fragment) return null;
    return fragment instanceof DocumentFragment ? fragment.firstElementChild : fragment;
  }

  document.addEventListener("htmx:oobBeforeSwap", function (evt) {
    var target = evt.detail.target;
    var incoming = incomingOf(evt.detail.fragment);
    if (!target || !incoming || !incoming.dataset) return;
    var inc = incoming.dataset, cur = target.dataset;

    // Timeline events pushed after a known seq: apply only what continues what we show.
    if (inc.afterSeq !== undefined) {
      var have = +(cur.seq || 0), after = +inc.afterSeq, upto = +inc.seq;
      if (have >= upto) { evt.detail.shouldSwap = false; return; }
      if (have < after) { evt.detail.shouldSwap = false; resync(); return; }  // a gap
      Array.prototype.slice.call(incoming.children).forEach(function (li) {
        if (+li.dataset.seq <= have) li.remove(); else li.classList.add("ev-new");
      });
      cur.seq = String(upto);
      return;
    }
    // Same state as shown (a card someone may be typing in): leave it alone.
    if (inc.token !== undefined && cur.token !== undefined &&
        (cur.token === inc.token || cur.token === inc.token + ":bound")) {
      evt.detail.shouldSwap = false;
      return;
    }
    // Older than what the page shows (messages can overtake responses): drop it. A list row
    // at the same seq is the same row: leave it (and the reviewer's open decline box) alone.
    if (inc.seq !== undefined && cur.seq !== undefined &&
        (+inc.seq < +cur.seq || (+inc.seq === +cur.seq && target.matches("tr.row")))) {
      evt.detail.shouldSwap = false;
      return;
    }
    // A row this reviewer just decided stays on screen and follows its run: a push may not
    // delete it, and a pushed version of the row (which can overtake the answer to the
    // decision) keeps it marked, or the next push would delete it.
    if (cur.keep) {
      // htmx drops hx-swap-oob before this event: a deletion says so in data-delete.
      if (inc.delete !== undefined) {
        evt.detail.shouldSwap = false;
        return;
      }
      inc.keep = cur.keep;
    }
  });

  // A decision sent from an inbox row keeps that row on screen whatever arrives first: the
  // answer (the decided row) or a push saying the run left the inbox. A claim, release or
  // assignment is not a decision: the row leaves when someone else decides.
  document.addEventListener("htmx:beforeRequest", function (evt) {
    var elt = evt.detail.elt;
    var row = elt.closest && elt.closest("tr.row[id^=inbox-row-]");
    if (!row || elt.closest(".claim")) return;
    if (evt.detail.requestConfig && evt.detail.requestConfig.verb === "post") row.dataset.keep = "1";
  });

  // A pushed row that is not on the page: insert it where the server says it belongs.
  document.addEventListener("htmx:oobErrorNoTarget", function (evt) {
    var el = evt.detail.content;
    if (!el || !el.dataset || !el.dataset.insertInto) return;
    var container = document.getElementById(el.dataset.insertInto);
    if (!container || document.getElementById(el.id)) return;
    el.removeAttribute("hx-swap-oob");
    var items = Array.prototype.filter.call(container.children, function (c) { return c.id; });
    var at = el.dataset.insertAt === "end" ? items.length : +el.dataset.insertAt;
    container.insertBefore(el, items[at] || (items.length ? items[items.length - 1].nextSibling : container.firstChild));
    el.classList.add("row-enter");
    htmx.process(el);
    var size = +(container.dataset.pageSize || 0);
    items = Array.prototype.filter.call(container.children, function (c) { return c.id; });
    while (size && items.length > size) {
      var drop = container.dataset.trim === "start" ? items.shift() : items.pop();
      if (drop === el) break;
      drop.remove();
    }
  });

  // A list that keeps showing fewer rows than the server says match (a pushed insertion was
  // missed) re-syncs from the database. Checked again after a pause: a total can arrive a
  // moment before the rows it counts, and a needless re-fetch would redraw rows being used.
  var countCheck = null, lastCountResync = 0;
  function listShort() {
    if (new URLSearchParams(location.search).get("page") > 1) return false;
    return [["inbox-total", "inbox-rows"], ["runs-total", "runs-rows"]].some(function (pair) {
      var total = document.getElementById(pair[0]), rows = document.getElementById(pair[1]);
      if (!total || !rows || total.dataset.count === undefined) return false;
      // A row kept after this reviewer's decision is shown too; while a decision is under way
      // (a kept row) a re-fetch would drop it, so the check waits for the next total.
      if (rows.querySelector("tr.row[data-keep]")) return false;
      var shown = rows.querySelectorAll("tr.row").length;
      var expected = Math.min(+total.dataset.count, +(rows.dataset.pageSize || 0) || Infinity);
      return shown < expected;
    });
  }
  document.addEventListener("htmx:oobAfterSwap", function (evt) {
    var id = evt.detail.target && evt.detail.target.id;
    if ((id !== "inbox-total" && id !== "runs-total") || countCheck || !listShort()) return;
    countCheck = setTimeout(function () {
      countCheck = null;
      if (listShort() && Date.now() - lastCountResync > 5000) {
        lastCountResync = Date.now();
        resync();
      }
    }, 1500);
  });

  document.addEventListener("htmx:afterSettle", function () {
    document.querySelectorAll("[data-watch]").forEach(function (el) {
      if (!watched.has(el.dataset.watch)) sendWatch(el.dataset.watch);
    });
    refreshTimes();
    markSelected();
  });
  // --- bounded lists (timeline, checkpoints): the page keeps the newest data-keep items;
  // "load older" fetches the timeline's older events on demand ---

  function trimLists() {
    document.querySelectorAll("[data-keep]").forEach(trim);
  }

  function trim(list) {
    var keep = +list.dataset.keep;
    if (!keep || list.children.length <= keep + 1) return;
    var items = list.querySelectorAll(":scope > [data-seq]");
    if (items.length <= keep) return;
    for (var i = items.length - 1; i >= keep; i--) items[i].remove();
    if (!list.dataset.olderUrl) return;
    // "Load older" now starts below the oldest item kept.
    var more = list.querySelector(":scope > li.more");
    if (more) more.remove();
    var url = list.dataset.olderUrl + "?before=" + items[keep - 1].dataset.seq;
    var li = document.createElement("li");
    li.className = "more";
    var a = document.createElement("a");
    a.className = "btn small";
    a.textContent = "Load older events";
    a.setAttribute("href", url);
    a.setAttribute("hx-get", url);
    a.setAttribute("hx-target", "closest li");
    a.setAttribute("hx-swap", "outerHTML");
    li.appendChild(a);
    list.appendChild(li);
    htmx.process(li);
  }

  document.addEventListener("htmx:oobAfterSwap", function () {
    trimLists();
    refreshSoon();
    // "every run matching the filter (N)" follows the list's pushed total.
    var total = document.getElementById("runs-total");
    var label = document.querySelector("[data-total]");
    if (total && label) label.textContent = parseInt(total.textContent, 10);
  });

  // --- flashes and errors ---------------------------------------------------------------

  function flash(text, level) {
    var box = document.getElementById("flash");
    if (!box) return;
    var div = document.createElement("div");
    div.className = "flash flash-" + (level || "info");
    div.textContent = text;  // text, never HTML
    div.setAttribute("data-autohide", "");
    box.replaceChildren(div);
    autohide();
  }

  function autohide() {
    document.querySelectorAll("[data-autohide]").forEach(function (el) {
      if (el.dataset.hiding) return;
      el.dataset.hiding = "1";
      setTimeout(function () { el.remove(); }, 6000);
    });
  }

  document.addEventListener("htmx:responseError", function (evt) {
    var status = evt.detail.xhr ? evt.detail.xhr.status : 0;
    flash(status === 403 ? "Not allowed, or your session expired: reload the page."
      : "Something went wrong (HTTP " + status + "). Try again.", "error");
  });
  document.addEventListener("htmx:sendError", function () {
    flash("Network error: the server did not answer.", "error");
  });

  // --- relative times -------------------------------------------------------------------

  function relative(date) {
    var s = (Date.now() - date.getTime()) / 1000, future = s < 0;
    s = Math.abs(s);
    if (s < 5) return "just now";
    var t = s < 60 ? Math.floor(s) + " s" : s < 3600 ? Math.floor(s / 60) + " min"
      : s < 86400 ? Math.floor(s / 3600) + " h" : Math.floor(s / 86400) + " d";
    return future ? "in " + t : t + " ago";
  }

  // A review deadline counts down: "12 min left", then "overdue by 3 min" (styled overdue).
  function deadlineText(date) {
    var s = (date.getTime() - Date.now()) / 1000, left = s > 0;
    s = Math.abs(s);
    var t = s < 60 ? Math.floor(s) + " s" : s < 3600 ? Math.floor(s / 60) + " min"
      : s < 86400 ? Math.floor(s / 3600) + " h" : Math.floor(s / 86400) + " d";
    return left ? t + " left" : "overdue by " + t;
  }

  // Claims are rendered the same for every viewer; the holder's own controls show by class.
  function markClaims() {
    var me = body().dataset.user || "";
    document.querySelectorAll(".claim[data-claimed-by]").forEach(function (el) {
      el.classList.toggle("mine", !!me && el.dataset.claimedBy === me);
    });
  }

  function refreshTimes() {
    markClaims();
    document.querySelectorAll("time[data-deadline]").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (isNaN(d)) return;
      var text = deadlineText(d);
      if (el.textContent !== text) el.textContent = text;
      el.classList.toggle("overdue", d.getTime() <= Date.now());
    });
    document.querySelectorAll("time[datetime]:not([data-deadline])").forEach(function (el) {
      var d = new Date(el.getAttribute("datetime"));
      if (isNaN(d)) return;
      var text = relative(d);
      if (el.textContent !== text) el.textContent = text;  // untouched nodes cost no layout
    });
  }

  // A push swaps several regions: refresh once per frame, not once per region.
  var refreshQueued = false;
  function refreshSoon() {
    if (refreshQueued) return;
    refreshQueued = true;
    requestAnimationFrame(function () {
      refreshQueued = false;
      refreshTimes();
      markSelected();
    });
  }
  setInterval(refreshTimes, 15000);

  // --- clicks: copy, select all, dismiss, row selection ----------------------------------------

  document.addEventListener("click", function (evt) {
    var copy = evt.target.closest("button.copy");
    if (copy) {
      var text = copy.dataset.copy;
      var done = function () {
        copy.classList.add("copied");
        setTimeout(function () { copy.classList.remove("copied"); }, 1200);
      };
      if (navigator.clipboard && window.isSecureContext) {
        navigator.clipboard.writeText(text).then(done);
      } else {
        var ta = document.createElement("textarea");
        ta.value = text; document.body.appendChild(ta); ta.select();
        try { document.execCommand("copy"); done(); } catch (e) { /* nothing to do */ }
        ta.remove();
      }
      return;
    }
    var dismiss = evt.target.closest("[data-dismiss]");
    if (dismiss) {
      var panel = document.getElementById(dismiss.dataset.dismiss);
      if (panel) panel.replaceChildren();
      return;
    }
    if (evt.target.closest("[data-help]")) { openHelp(); return; }
    var row = evt.target.closest("[data-keys=rows] tbody tr.row");
    if (row && !evt.target.closest("a, button, input, textarea, select, summary, label")) select(row);
  });

  document.addEventListener("change", function (evt) {
    var all = evt.target.closest("[data-select-all]");
    if (!all) return;
    var table = all.closest("table");
    table.querySelectorAll('input[name="' + all.dataset.selectAll + '"]:not(:disabled)').forEach(function (cb) {
      cb.checked = all.checked;
    });
  });

  // --- keyboard ---------------------------------------------------------------------------

  function rows() {
    var table = document.querySelector("[data-keys=rows]");
    return table ? Array.prototype.slice.call(table.querySelectorAll("tbody tr.row")) : [];
  }

  // The selection is remembered by id: a pushed row replaces the element, not the selection.
  var selectedId = null;

  function selected() {
    var row = selectedId && document.getElementById(selectedId);
    return row && row.matches("[data-keys=rows] tbody tr.row") ? row : null;
  }

  function markSelected() {
    var row = selected();
    rows().forEach(function (r) { r.classList.toggle("selected", r === row); });
  }

  function select(row) {
    selectedId = row ? row.id : null;
    markSelected();
    if (row) row.scrollIntoView({ block: "nearest" });
  }

  function move(step) {
    var all = rows();
    if (!all.length) return;
    var i = all.indexOf(selected());
    select(all[Math.max(0, Math.min(all.length - 1, i < 0 ? 0 : i + step))]);
  }

  function openDetails(details, focusSelector) {
    if (!details) return false;
    details.open = true;
    var field = details.querySelector(focusSelector || "textarea, input:not([type=hidden]), select");
    if (field) field.focus();
    return true;
  }

  function openHelp() {
    var dialog = document.getElementById("help");
    if (dialog && !dialog.open) dialog.showModal();
  }

  function scope() { return selected() || document; }

  function act(key) {
    var where = scope();
    if (key === "a") {
      var approve = where.querySelector("button[data-act=approve]:not([disabled])");
      if (approve) approve.click();
      return !!approve;
    }
    if (key === "d") return openDetails(where.querySelector("details[data-act=decline]"), "textarea");
    if (key === "e") {
      var editLink = where.querySelector("a[data-act=edit]");
      if (editLink) { editLink.click(); return true; }
      return openDetails(where.querySelector("details[data-act=edit]"));
    }
    if (key === "r") {
      var replyLink = where.querySelector("a[data-act=reply], a[data-act=edit]");
      if (replyLink) { replyLink.click(); return true; }
      var reply = document.querySelector("form[data-act=reply] input:not([type=hidden]), form[data-act=reply] textarea, form[data-act=reply] select");
      if (reply) { reply.focus(); return true; }
      return openDetails(document.querySelector("details[data-act=edit]"));
    }
    return false;
  }

  document.addEventListener("keydown", function (evt) {
    if (evt.metaKey || evt.ctrlKey || evt.altKey) return;
    var typing = evt.target.closest("input, textarea, select, [contenteditable]");
    if (evt.key === "Escape") {
      if (typing) evt.target.blur();
      document.querySelectorAll("details[data-act][open]").forEach(function (d) { d.open = false; });
      return;
    }
    if (typing) {
      // Enter in the one-line decline box of an inbox row submits it.
      if (evt.key === "Enter" && !evt.shiftKey && evt.target.matches("tr.row textarea[name=reason]")) {
        evt.preventDefault();
        htmx.trigger(evt.target.form, "submit");
      }
      return;
    }
    var handled = true;
    switch (evt.key) {
      case "j": move(1); break;
      case "k": move(-1); break;
      case "Enter":
        var row = selected();
        if (row && row.dataset.href) window.location.href = row.dataset.href; else handled = false;
        break;
      case "?": openHelp(); break;
      case "a": case "d": case "e": case "r": handled = act(evt.key); break;
      default: handled = false;
    }
    if (handled) evt.preventDefault();
  });

  function fromHash() {
    var hash = window.location.hash;
    if (hash.indexOf("#edit-") === 0) openDetails(document.getElementById(hash.slice(1)));
    else if (hash === "#reply") act("r");
  }

  document.addEventListener("DOMContentLoaded", function () {
    refreshTimes();
    autohide();
    fromHash();
    if (!document.getElementById("live")) body().dataset.live = "off";
  });
})();
