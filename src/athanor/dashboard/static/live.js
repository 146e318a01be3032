// Live pages without reloads: every few seconds <main> is fetched again from the same address (?fragment=1 gives
// only its contents, rendered and escaped by the server) and swapped in when it changed. No other code runs.
(function () {
  "use strict";
  var main = document.getElementById("main");
  var every = main ? parseInt(main.getAttribute("data-live"), 10) : 0;
  if (!every) { return; }
  function tick() {
    if (document.hidden) { setTimeout(tick, every); return; }
    var url = new URL(window.location.href);
    url.searchParams.set("fragment", "1");
    fetch(url.toString(), { cache: "no-store", credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.text() : null; })
      .then(function (html) {
        if (html !== null && html !== main.innerHTML) { main.innerHTML = html; }
      })
      .catch(function () {})
      .then(function () { setTimeout(tick, every); });
  }
  setTimeout(tick, every);
})();
