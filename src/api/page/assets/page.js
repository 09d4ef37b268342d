// tokensaver ledger page: refresh the live panel every few seconds and count down hold
// expiries. The server renders everything (and escapes it); this only swaps its HTML in.
"use strict";
(function () {
  const panel = document.getElementById("panel");
  if (!panel) return;
  const live = document.getElementById("live");
  const updated = document.getElementById("updated");
  const REFRESH_MS = 5000;
  let offset = 0; // server clock − browser clock

  function readClock() {
    const stamp = panel.querySelector("[data-now-ms]");
    if (stamp) {
      offset = Number(stamp.dataset.nowMs) - Date.now();
      if (updated) updated.textContent = "updated " + stamp.dataset.clock + " UTC";
    }
  }

  // Never replace a form someone is filling in.
  function busy() {
    const active = document.activeElement;
    if (active && panel.contains(active) && /^(INPUT|SELECT|BUTTON)$/.test(active.tagName)) return true;
    return Array.from(panel.querySelectorAll("input[type=password]")).some((i) => i.value !== "");
  }

  function countdowns() {
    const now = Date.now() + offset;
    for (const el of panel.querySelectorAll("[data-expires-ms]")) {
      const left = Math.max(0, Number(el.dataset.expiresMs) - now);
      const s = Math.floor(left / 1000);
      const m = Math.floor(s / 60);
      el.textContent = left === 0 ? "expired" : "in " + m + "m " + String(s % 60).padStart(2, "0") + "s";
    }
  }

  async function refresh() {
    if ((live && !live.checked) || document.hidden || busy()) return;
    try {
      const r = await fetch(panel.dataset.src, { credentials: "same-origin", cache: "no-store" });
      if (r.status === 401) { window.location.assign("/page/"); return; }
      if (!r.ok) return;
      panel.innerHTML = await r.text();
      readClock();
      countdowns();
      document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
    } catch (_) {
      if (updated) updated.textContent = "offline: retrying";
    }
  }

  readClock();
  countdowns();
  setInterval(countdowns, 1000);
  setInterval(refresh, REFRESH_MS);
})();
