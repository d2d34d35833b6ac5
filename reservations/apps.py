from django.apps import AppConfig


class ReservationsConfig(AppConfig):
    name = "reservations"
    verbose_name = "Reservations"

    def ready(self) -> None:
        # Registers the lease-expiry hook with the capacity reconciler in every process.
        from reservations import services  # noqa: F401
