from django.apps import AppConfig
from django.db.models.signals import post_delete, post_save


class CoreConfig(AppConfig):
    name = "core"
    verbose_name = "Access and audit"

    def ready(self) -> None:
        from core.auth_cache import auth_cache_forget
        from core.models import ApiToken, Principal, RoleBinding

        # This process forgets the tokens it remembers on its own writes at once; the
        # other processes hear of them by `NOTIFY auth_changed` at commit (core migration 0006).
        for model in (ApiToken, Principal, RoleBinding):
            for signal in (post_save, post_delete):
                signal.connect(
                    auth_cache_forget, sender=model, dispatch_uid=f"auth-cache-{model.__name__}-{signal}"
                )
