/* trainyard frontend; uplot 1.6.32; sources 44d37f6ea29157df */
function t(){let e=document.querySelector('meta[name="csrf-token"]');return e?e.content:""}var n=document.getElementById("swagger-ui");window.SwaggerUIBundle({url:n.dataset.schemaUrl,domNode:n,deepLinking:!0,docExpansion:"none",defaultModelsExpandDepth:0,requestInterceptor:e=>(e.headers["X-CSRFToken"]=t(),e)});
