from django.apps import AppConfig


class ReservationsConfig(AppConfig):
    name = "reservations"
    verbose_name = "Reservations"

    def ready(self) -> None:
        # The services connect their receivers (a node's refusal releases the reservation,
        # `reservations.delivery.signals.assignment_refused`) in every process that delivers.
        from reservations import services  # noqa: F401
