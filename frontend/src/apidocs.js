// API docs page: ReDoc (from drf-spectacular-sidecar, served by the console: no CDN) rendering
// the console's own OpenAPI schema. ReDoc rather than Swagger UI: Swagger UI's operation rows
// nest buttons inside buttons, which screen readers cannot use (axe: nested-interactive).
const root = document.getElementById("api-reference");
window.Redoc.init(
  root.dataset.schemaUrl,
  {
    hideDownloadButton: true,
    // ReDoc draws on white in both OS themes; these colours keep WCAG AA contrast there
    // (its defaults' greys and the "required" red fall short; axe checks this page).
    theme: {
      colors: {
        primary: { main: "#0b62c4", light: "#0b62c4" },
        success: { main: "#17702c" },
        warning: { main: "#8a5a00" },
        error: { main: "#b3261e" },
        text: { primary: "#1b2129", secondary: "#4f5966" },
        http: { get: "#17702c", post: "#0b62c4", put: "#8a5a00", delete: "#b3261e", patch: "#6b3fc2" },
      },
      schema: { typeNameColor: "#4f5966", typeTitleColor: "#4f5966", requireLabelColor: "#b3261e", linesColor: "#8a94a3" },
      sidebar: { backgroundColor: "#f4f6f9", textColor: "#1b2129" },
      rightPanel: { backgroundColor: "#1b2129", textColor: "#ffffff" },
      typography: { fontFamily: "system-ui, sans-serif", headings: { fontFamily: "system-ui, sans-serif" }, code: { color: "#8b1c5c" } },
    },
  },
  root,
);
