// peerd console: live thread items (server-sent events, Last-Event-ID resume), pairing-code
// countdowns, and a "reconnecting" state for every live part of a page. No inline scripts (CSP).
"use strict";

(function () {
  function setLive(state, text) {
    const el = document.getElementById("live-state");
    if (el) {
      el.dataset.state = state;
      el.textContent = text;
    }
    const items = document.getElementById("items");
    if (items) items.classList.toggle("stale", state !== "live");
  }

  // Server-rendered HTML (autoescaped by the console's templates) replacing the element with the
  // same id; htmx is told about it so its forms keep working.
  function swapById(html) {
    const t = document.createElement("template");
    t.innerHTML = html.trim();
    const fresh = t.content.firstElementChild;
    if (!fresh || !fresh.id) return null;
    const old = document.getElementById(fresh.id);
    if (!old) return null;
    old.replaceWith(fresh);
    if (window.htmx) window.htmx.process(fresh);
    return fresh;
  }

  // A thread's items: EventSource reconnects by itself after a dropped connection (sending
  // Last-Event-ID); after a refused one (the daemon restarting) it gives up, so we open a new one
  // with ?last= and back off up to 30 s. The server sends each item once, by position.
  function stream(list) {
    const base = list.dataset.stream;
    let lastId = null;
    let source = null;
    let delay = 1000;
    function open() {
      const url = lastId === null ? base : base.replace(/\?.*$/, "") + "?last=" + encodeURIComponent(lastId);
      source = new EventSource(url);
      source.onopen = function () {
        delay = 1000;
        setLive("live", "Live: new items appear as they arrive.");
      };
      source.addEventListener("item", function (e) {
        lastId = e.lastEventId;
        list.insertAdjacentHTML("beforeend", e.data);
      });
      // A part of the page that changed (the run in the header, the usage, the run's buttons):
      // one element, swapped for the element with its id.
      source.addEventListener("swap", function (e) {
        lastId = e.lastEventId;
        swapById(e.data);
      });
      source.addEventListener("problem", function (e) {
        setLive("reconnecting", "Reconnecting: " + e.data);
      });
      source.onerror = function () {
        setLive("reconnecting", "Reconnecting… the items shown may be out of date.");
        if (source.readyState === EventSource.CLOSED) {
          setTimeout(open, delay);
          delay = Math.min(delay * 2, 30000);
        }
      };
    }
    open();
    window.addEventListener("pagehide", function () { if (source) source.close(); });
  }

  function countdowns() {
    const els = document.querySelectorAll("[data-expires]");
    if (!els.length) return;
    function tick() {
      const now = Date.now() / 1000;
      els.forEach(function (el) {
        const left = Math.round(parseFloat(el.dataset.expires) - now);
        if (left <= 0) {
          el.textContent = "expired";
          el.classList.add("expired");
          return;
        }
        const m = Math.floor(left / 60), s = left % 60;
        el.textContent = "expires in " + m + ":" + String(s).padStart(2, "0");
      });
    }
    tick();
    setInterval(tick, 1000);
  }

  // Live fragments (htmx): when a refresh fails, say so and try again.
  function liveFragments() {
    function failed(e) {
      const el = e.detail && e.detail.elt;
      if (!el || !el.hasAttribute("data-live")) return;
      el.setAttribute("aria-busy", "true");
      let note = el.querySelector(".reconnecting");
      if (!note) {
        note = document.createElement("p");
        note.className = "notice reconnecting";
        note.setAttribute("role", "status");
        el.prepend(note);
      }
      note.textContent = "Reconnecting… what is shown may be out of date.";
      setTimeout(function () { window.htmx.trigger(el, "retry"); }, 3000);
    }
    document.body.addEventListener("htmx:responseError", failed);
    document.body.addEventListener("htmx:sendError", failed);
    document.body.addEventListener("htmx:afterSwap", function (e) {
      const el = e.detail && e.detail.elt;
      if (el) el.removeAttribute("aria-busy");
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    const list = document.querySelector("[data-stream]");
    if (list && window.EventSource) stream(list);
    countdowns();
    if (window.htmx) liveFragments();
  });
})();
