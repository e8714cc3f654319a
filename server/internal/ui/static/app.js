// Fleetlearn dashboard: live updates and small conveniences. Loaded from
// the dashboard itself under a CSP that allows no inline script.
"use strict";

(function () {
  // A sign-in link may carry the token in the fragment, which browsers
  // never send to the server; it is posted once and wiped from history.
  function loginFromFragment() {
    var form = document.getElementById("login-form");
    if (!form || location.hash.indexOf("#token=") !== 0) return;
    var tok = decodeURIComponent(location.hash.slice("#token=".length));
    history.replaceState(null, "", location.pathname + location.search);
    if (!tok || document.getElementById("login-problem")) return;
    form.elements.token.value = tok;
    form.submit();
  }

  function confirmActions(root) {
    root.querySelectorAll("button[data-confirm]").forEach(function (b) {
      b.addEventListener("click", function (ev) {
        if (!window.confirm(b.getAttribute("data-confirm"))) ev.preventDefault();
      });
    });
  }

  var pending = false;
  var again = false;
  // redraw fetches the page again and swaps its main content, with fresh
  // charts; the open details stay open. An update that arrives while a
  // fetch is in flight is not dropped: one more fetch follows it, so the
  // last event (a round closing, the task ending) is always drawn.
  function redraw() {
    if (pending) { again = true; return; }
    pending = true;
    function done() {
      pending = false;
      if (again) { again = false; redraw(); }
    }
    fetch(location.href, { credentials: "same-origin", headers: { "Accept": "text/html" } })
      .then(function (r) {
        if (r.redirected || !r.ok) { location.reload(); return null; }
        return r.text();
      })
      .then(function (html) {
        if (html !== null) swap(html);
        done();
      })
      .catch(done);
  }

  function swap(html) {
    var doc = new DOMParser().parseFromString(html, "text/html");
    var next = doc.getElementById("main");
    var cur = document.getElementById("main");
    if (!next || !cur) return;
    var open = {};
    cur.querySelectorAll("details[open]").forEach(function (d, i) { open[i] = true; });
    var stamp = Date.now();
    next.querySelectorAll("figure.chart img").forEach(function (img) {
      img.setAttribute("src", img.getAttribute("src") + "?v=" + stamp);
    });
    cur.replaceWith(next);
    next.querySelectorAll("details").forEach(function (d, i) { if (open[i]) d.open = true; });
    confirmActions(next);
    document.dispatchEvent(new CustomEvent("fleetlearn:redrawn"));
    live(next);
  }

  var source = null;
  var sourceURL = "";
  var retry = null;
  function live(main) {
    var url = main.getAttribute("data-live") || "";
    if (url === sourceURL) return;
    liveStatus("");
    connect(url);
  }

  function connect(url) {
    if (source) { source.close(); source = null; }
    if (retry) { clearTimeout(retry); retry = null; }
    sourceURL = url;
    if (!url || !window.EventSource) return;
    var s = new EventSource(url);
    source = s;
    s.addEventListener("open", function () { liveStatus(""); });
    s.addEventListener("round", redraw);
    s.addEventListener("refresh", redraw);
    s.addEventListener("end", function () {
      // The watch is over (the task ended): the next page says whether
      // there is anything left to follow.
      s.close();
      source = null;
      sourceURL = "";
      redraw();
    });
    s.addEventListener("error", function () {
      // A dropped connection is retried by EventSource itself; an answer
      // other than a stream (a refusal) closes it for good.
      if (s !== source || s.readyState !== EventSource.CLOSED) return;
      source = null;
      refused(url);
    });
  }

  // refused learns why the server would not stream, which EventSource does
  // not tell: the dashboard answers 429 or 503 with Retry-After and a
  // sentence to show when it holds too many streams for this viewer.
  function refused(url) {
    function again(seconds) {
      retry = setTimeout(function () {
        retry = null;
        if (sourceURL === url && !source) connect(url);
      }, seconds * 1000);
    }
    var ctl = window.AbortController ? new AbortController() : null;
    fetch(url, { credentials: "same-origin", headers: { "Accept": "text/event-stream" }, signal: ctl ? ctl.signal : undefined })
      .then(function (r) {
        if (r.ok) {
          // Room again: let this probe go and stream for real.
          if (ctl) ctl.abort();
          again(1);
          return;
        }
        if (r.status === 401) { location.reload(); return; }
        var wait = parseInt(r.headers.get("Retry-After"), 10);
        return r.text().then(function (msg) {
          if (r.status === 429 || r.status === 503) {
            liveStatus(msg.trim());
            again(wait > 0 ? wait : 30);
          } else {
            liveStatus("Live updates stopped (" + r.status + "): reload the page to try again.");
          }
        });
      })
      .catch(function () {
        if (sourceURL !== url) return;
        liveStatus("Live updates stopped: the dashboard cannot be reached. Reload the page to try again.");
      });
  }

  function liveStatus(text) {
    var el = document.getElementById("live-status");
    if (!el) return;
    el.textContent = text;
    el.hidden = !text;
  }

  document.addEventListener("DOMContentLoaded", function () {
    loginFromFragment();
    confirmActions(document);
    var main = document.getElementById("main");
    if (main) live(main);
  });
})();
