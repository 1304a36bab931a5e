from django.apps import AppConfig


class MarketplaceConfig(AppConfig):
    name = "marketplace"
    verbose_name = "Marketplace"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in, user_logged_out

        from marketplace.events import on_user_logged_in, on_user_logged_out

        # A browser's live sockets end with its session (see marketplace.events).
        user_logged_out.connect(on_user_logged_out, dispatch_uid="marketplace.close_sockets_on_logout")
        user_logged_in.connect(on_user_logged_in, dispatch_uid="marketplace.close_sockets_of_replaced_session")
