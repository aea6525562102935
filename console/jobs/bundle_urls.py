"""URLs of the bundle API (/api/v1/bundles/)."""

from django.urls import path, re_path

from console.jobs.bundle_api import BundleArchive, BundleDetail, BundleLimits, BundleListCreate

urlpatterns = [
    path("bundles/", BundleListCreate.as_view(), name="bundle-list"),
    path("bundles/limits/", BundleLimits.as_view(), name="bundle-limits"),
    path("bundles/<int:pk>/", BundleDetail.as_view(), name="bundle-detail"),
    re_path(r"^bundles/(?P<sha256>[0-9a-f]{64})/archive/$", BundleArchive.as_view(), name="bundle-archive"),
]
