// Routewatch front-end glue. No inline scripts anywhere (the CSP forbids them).
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  if (window.htmx) {
    // Belt and braces: the same settings are in <meta name="htmx-config">.
    htmx.config.allowEval = false;
    htmx.config.allowScriptTags = false;
    htmx.config.selfRequestsOnly = true;
  }
});
