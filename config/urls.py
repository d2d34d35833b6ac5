"""The URLs: the landing page, `/healthz`, `/metrics`, the admin, the API under `/api/compute/`, its docs."""

from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from core.api.envelope import api_not_found, api_read_only
from core.views import admin_index, healthz, landing
from operations.metrics.views import MetricsView

urlpatterns = [
    path("", landing, name="landing"),
    path("healthz", healthz, name="healthz"),
    # Prometheus's scrape (operations/metrics): a peer in METRICS_ALLOWED_NETS or a metrics token.
    path("metrics", MetricsView.as_view(), name="metrics"),
    # The admin's index, with the worker's status (its lag per job) above the apps;
    # every other admin page is the admin's own.
    path("admin/", admin.site.admin_view(admin_index), name="admin-index"),
    path("admin/", admin.site.urls),
    path("api/compute/", include("capacity.api.urls")),
    path("api/compute/", include("reservations.api.urls")),
    path("api/compute/", include("operations.api.urls")),
    path("api/schema/", api_read_only(SpectacularAPIView.as_view()), name="schema"),
    path("api/docs/", api_read_only(SpectacularSwaggerView.as_view(url_name="schema")), name="api-docs"),
    # Last: any other /api/ URL answers the JSON envelope, whatever the method,
    # even with DEBUG on (where handler404 is not used) and before the CSRF
    # middleware could answer a POST with its HTML page (the view is exempt),
    # so clients never parse an HTML page. `GET api/docs` and `GET api/schema`
    # without their slash are redirected by it.
    re_path(r"^api/", api_not_found),
]

# Outside /api/ these fall back to Django's own pages (the admin).
handler400 = "core.api.envelope.handler400"
handler404 = "core.api.envelope.handler404"
handler500 = "core.api.envelope.handler500"
