import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

from django.core.asgi import get_asgi_application

django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from console.api.ws_auth import BearerOrSession  # noqa: E402
from console.telemetry.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # A bearer token on the handshake (scripts, the CLI), else the session behind the Origin check.
        "websocket": BearerOrSession(URLRouter(websocket_urlpatterns)),
    }
)
