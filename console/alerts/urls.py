from rest_framework.routers import SimpleRouter

from console.alerts.api import AlertViewSet, ChannelViewSet, RuleViewSet

router = SimpleRouter()
router.register("alerts/channels", ChannelViewSet, basename="alert-channel")
router.register("alerts/rules", RuleViewSet, basename="alert-rule")
router.register("alerts", AlertViewSet, basename="alert")
urlpatterns = router.urls
