from django.urls import path

from console.api import pages

urlpatterns = [
    path("account/tokens/", pages.tokens_page, name="tokens_page"),
    path("audit/", pages.audit_page, name="audit_page"),
]
