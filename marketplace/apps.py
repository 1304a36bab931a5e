from django.apps import AppConfig


class MarketplaceConfig(AppConfig):
    name = "marketplace"
    verbose_name = "Marketplace"

    def ready(self) -> None:
        from django.conf import settings
        from django.contrib.auth.signals import user_logged_in, user_logged_out
        from django.db.models.signals import post_save, pre_save

        from marketplace.events import on_user_logged_in, on_user_logged_out, on_user_post_save, on_user_pre_save

        # A browser's live sockets end with its session (see marketplace.events).
        user_logged_out.connect(on_user_logged_out, dispatch_uid="marketplace.close_sockets_on_logout")
        user_logged_in.connect(on_user_logged_in, dispatch_uid="marketplace.close_sockets_of_replaced_session")
        # ...and with a password change, as Django's sessions do.
        pre_save.connect(
            on_user_pre_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="marketplace.password_pre_save"
        )
        post_save.connect(
            on_user_post_save, sender=settings.AUTH_USER_MODEL, dispatch_uid="marketplace.password_changed"
        )
