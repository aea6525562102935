from django.urls import path

from console.experiments import pages

urlpatterns = [
    path("compare/", pages.compare_page, name="compare_page"),
    path("sweeps/", pages.sweep_list, name="sweep_list"),
    path("sweeps/new/", pages.sweep_new, name="sweep_new"),
    path("sweeps/<int:sweep_id>/", pages.sweep_detail, name="sweep_detail"),
]
