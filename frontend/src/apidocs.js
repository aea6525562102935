// API docs page: Swagger UI (from drf-spectacular-sidecar, served by the console) on the
// console's own OpenAPI schema; "Try it out" sends the session's CSRF token like the pages do.
import { csrfToken } from "./api.js";

const root = document.getElementById("swagger-ui");
window.SwaggerUIBundle({
  url: root.dataset.schemaUrl,
  domNode: root,
  deepLinking: true,
  docExpansion: "none",
  defaultModelsExpandDepth: 0,
  requestInterceptor: (request) => {
    request.headers["X-CSRFToken"] = csrfToken();
    return request;
  },
});
