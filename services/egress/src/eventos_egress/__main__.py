"""`python -m eventos_egress`: the send activities on queue `egress`, and owners' Retries."""

from __future__ import annotations

from eventos.channels.discord import DiscordApi, DiscordSender
from eventos.channels.email import EmailSender
from eventos.channels.http import provider_client
from eventos.channels.senders import Sender
from eventos.channels.settings import ChannelSettings
from eventos.channels.telegram import TelegramApi, TelegramSender
from eventos.channels.whatsapp import WhatsAppSender
from eventos.outbox.egress import Egress, retry_loop
from eventos.outbox.keys import OutboxKeys
from eventos.runtime.gauges import gauge_loop, read_outbox
from eventos.runtime.service import run_main
from eventos.runtime.wiring import ConnectedConfig, build_connected
from eventos.settings import SecretStore
from eventos.workers.activities import DbActivities
from eventos.workers.roles import egress_worker, run_forever


async def main() -> None:
    outbox = OutboxKeys.from_env()  # egress opens recipients: no key, no start
    channels = ChannelSettings.from_env()
    cfg = ConnectedConfig.from_env("egress")
    service, connected = await build_connected(cfg)
    http = provider_client()
    senders: dict[str, Sender] = {
        "telegram": TelegramSender(
            TelegramApi(http, channels.telegram_api), channels.send_timeout_s
        ),
        "whatsapp_business": WhatsAppSender(http, connected.pool, channels.send_timeout_s),
        "email": EmailSender(channels.send_timeout_s),
        "discord": DiscordSender(DiscordApi(http), channels.send_timeout_s),
    }
    egress = Egress(connected.pool, outbox, senders, SecretStore.from_env(), channels)
    db = DbActivities(connected.pool, outbox=outbox, egress=egress)
    service.loops.append(lambda: run_forever(connected.temporal, lambda c: egress_worker(c, db)))
    service.loops.append(lambda: gauge_loop(read_outbox, connected.pool))
    service.loops.append(lambda: retry_loop(egress))
    service.on_stop.append(http.aclose)
    await service.run()


if __name__ == "__main__":
    run_main("egress", main())
