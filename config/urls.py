from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/compute/", include("capacity.api.urls")),
    path("api/compute/", include("reservations.api.urls")),
    path("api/compute/", include("inventory.api.urls")),
    path("api/compute/", include("capacity.api.timeline")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
]
