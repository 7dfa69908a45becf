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

  // Each run's boundary among the items says the run's number, status and usage as the usage-by-
  // run table (kept live by the stream) says them: text only, copied from the table's cells.
  function syncBoundaries() {
    document.querySelectorAll("#items .run-boundary").forEach(function (mark) {
      const row = document.querySelector('#usage-runs tr[data-run="' + CSS.escape(mark.dataset.run) + '"]');
      if (!row || row.cells.length < 3) return;
      mark.querySelector(".run-no").textContent = "Run " + row.cells[0].textContent.trim();
      mark.querySelector(".state").textContent =
        row.cells[1].textContent.trim() + " · " + row.cells[2].textContent.trim();
    });
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
        const items = list.querySelectorAll("li.item");
        const before = items.length ? items[items.length - 1].dataset.run : null;
        list.insertAdjacentHTML("beforeend", e.data);
        const added = list.lastElementChild;
        if (added && added.dataset.run && added.dataset.run !== before) {
          const mark = document.createElement("li");
          mark.className = "run-boundary";
          mark.dataset.run = added.dataset.run;
          const no = document.createElement("span");
          no.className = "run-no";
          no.textContent = "Run";
          const state = document.createElement("span");
          state.className = "state";
          mark.append(no, " ", state);
          added.before(mark);
          syncBoundaries();
        }
      });
      // A part of the page that changed (the run in the header, the usage, the run's buttons):
      // one element, swapped for the element with its id.
      source.addEventListener("swap", function (e) {
        lastId = e.lastEventId;
        const fresh = swapById(e.data);
        if (fresh && fresh.id === "usage-runs") syncBoundaries();
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

  // The board: the server sends the whole board again when it changed (one element, swapped);
  // focus stays on the card it was on when that card is still shown.
  function boardStream(holder) {
    let source = null;
    let delay = 1000;
    function open() {
      source = new EventSource(holder.dataset.boardStream);
      source.onopen = function () {
        delay = 1000;
        setLive("live", "Live: the board follows the fleet.");
      };
      source.addEventListener("swap", function (e) {
        const focused = document.activeElement && document.activeElement.closest(".card");
        const keep = focused ? focused.dataset.thread : null;
        swapById(e.data);
        setLive("live", "Live: the board follows the fleet.");
        if (keep) {
          const again = document.querySelector('.card[data-thread="' + CSS.escape(keep) + '"] a');
          if (again) again.focus();
        }
      });
      source.addEventListener("problem", function (e) {
        setLive("reconnecting", "Reconnecting: " + e.data);
      });
      source.onerror = function () {
        setLive("reconnecting", "Reconnecting… the board shown may be out of date.");
        if (source.readyState === EventSource.CLOSED) {
          setTimeout(open, delay);
          delay = Math.min(delay * 2, 30000);
        }
      };
    }
    open();
    window.addEventListener("pagehide", function () { if (source) source.close(); });
  }

  // Keys on the board: "/" to search; arrows move between cards (up and down in a column, left
  // and right to the next column with cards); Enter opens the focused card (it is a link).
  function boardKeys() {
    document.addEventListener("keydown", function (e) {
      if (e.altKey || e.ctrlKey || e.metaKey) return;
      const tag = (e.target && e.target.tagName) || "";
      const typing = tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT";
      if (e.key === "/" && !typing) {
        const q = document.getElementById("b-q");
        if (q) { e.preventDefault(); q.focus(); }
        return;
      }
      if (typing || ["ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight"].indexOf(e.key) < 0) return;
      const columns = Array.from(document.querySelectorAll("#board .column"));
      const card = e.target.closest && e.target.closest(".card");
      let target = null;
      if (!card) {
        target = document.querySelector("#board .card a");
      } else {
        const column = card.closest(".column");
        const cards = Array.from(column.querySelectorAll(".card"));
        const at = cards.indexOf(card);
        if (e.key === "ArrowDown") target = cards[at + 1];
        else if (e.key === "ArrowUp") target = cards[at - 1];
        else {
          const step = e.key === "ArrowRight" ? 1 : -1;
          for (let i = columns.indexOf(column) + step; i >= 0 && i < columns.length; i += step) {
            const there = columns[i].querySelectorAll(".card");
            if (there.length) { target = there[Math.min(at, there.length - 1)]; break; }
          }
        }
        if (target) target = target.querySelector("a");
      }
      if (target) { e.preventDefault(); target.focus(); }
    });
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
    const board = document.querySelector("[data-board-stream]");
    if (board && window.EventSource) boardStream(board);
    if (board) boardKeys();
    countdowns();
    if (window.htmx) liveFragments();
  });
})();
