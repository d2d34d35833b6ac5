from django.apps import AppConfig


class OperationsConfig(AppConfig):
    name = "operations"
    verbose_name = "Operations"

    def ready(self) -> None:
        # The placer tells whoever listens how long each placement took; the metrics count it.
        from operations.metrics.process import placer_observed
        from reservations.placer.commit import OBSERVERS

        if placer_observed not in OBSERVERS:
            OBSERVERS.append(placer_observed)
