// /api/v1/docs: the OpenAPI description rendered by Swagger UI (static/vendor/swagger-ui-dist-*),
// started here because the pages' CSP forbids inline scripts.
"use strict";

(function () {
  function start() {
    var root = document.getElementById("api-docs");
    if (!root || !window.SwaggerUIBundle) return;
    root.textContent = "";
    window.SwaggerUIBundle({
      url: root.dataset.url,
      domNode: root,
      validatorUrl: null, // no request to validator.swagger.io
      deepLinking: false,
      defaultModelsExpandDepth: 0,
      supportedSubmitMethods: ["get", "head"], // the API only reads
    });
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
