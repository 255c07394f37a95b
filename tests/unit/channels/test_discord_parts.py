"""The Discord driver's pure parts: the credential secret, signatures, the sealed interaction
token, records, option rendering, message parts and nonces."""

from __future__ import annotations

import json
import time

import pytest
from nacl.signing import SigningKey

from eventos import names
from eventos.channels.discord import (
    CONTENT_MAX,
    INTENTS,
    NONCE_MAX,
    DiscordCredential,
    DiscordCredentialError,
    interaction_record,
    message_record,
    nonce,
    open_token,
    parse_credential,
    parts,
    render_options,
    seal_token,
    verify,
)
from eventos.channels.settings import ChannelSettings
from eventos.errors import ConfigError
from eventos.testing import mentions

SALT = b"s" * 32
KEY = SigningKey(b"k" * 32)
APP = "1187000000000000001"


def secret(**fields: object) -> bytes:
    doc = {"bot_token": "bot.token.value", "application_id": APP,
           "public_key": bytes(KEY.verify_key).hex(), **fields}  # fmt: skip
    return json.dumps({k: v for k, v in doc.items() if v is not None}).encode()


def cred(token: str = "bot.token.value") -> DiscordCredential:
    return parse_credential(secret(bot_token=token))


def test_a_credential_secret_has_defaults_and_every_fault_named_without_the_token() -> None:
    c = cred()
    assert c.api == "https://discord.com/api/v10" and c.intents == INTENTS
    assert "bot.token.value" not in repr(c)
    bad = [b"not json", b"[1]", secret(bot_token=""), secret(bot_token="a b"),
           secret(application_id="app"), secret(application_id=None), secret(public_key="zz"),
           secret(public_key="ab" * 31), secret(api="ftp://x"), secret(intents=True),
           secret(intents=1 << 30), secret(extra=1)]  # fmt: skip
    for raw in bad:
        with pytest.raises(DiscordCredentialError) as err:
            parse_credential(raw)
        assert "bot.token.value" not in str(err.value) and str(err.value).startswith("discord")


def test_the_signature_covers_timestamp_and_body() -> None:
    body, stamp = b'{"type":1}', str(int(time.time()))
    signature = KEY.sign(stamp.encode() + body).signature.hex()
    public = bytes(KEY.verify_key)
    assert verify(public, signature, stamp, body)
    assert not verify(public, signature, stamp, body + b" ")
    assert not verify(public, signature, str(int(stamp) + 1), body)
    assert not verify(public, "zz", stamp, body) and not verify(public, None, stamp, body)
    assert not verify(public, signature[:-2], stamp, body)


def test_the_interaction_token_travels_sealed_and_only_this_bot_opens_it() -> None:
    reply_to = seal_token(cred(), "the-interaction-token")
    assert "the-interaction-token" not in reply_to and reply_to.startswith(f"interaction:{APP}:")
    assert open_token(cred(), reply_to) == (APP, "the-interaction-token")
    assert open_token(cred("another.bot.token"), reply_to) is None
    assert open_token(cred(), reply_to[:-4]) is None


def command(**extra: object) -> dict[str, object]:
    return {"id": "42", "type": 2, "token": "tok", "channel_id": "200", "guild_id": "100",
            "member": {"user": {"id": "300", "username": "ann", "global_name": "Ann"}},
            "data": {"name": "ask", "options": [{"name": "q", "type": 3, "value": "hi"}]},
            **extra}  # fmt: skip


def test_a_command_is_a_record_of_its_channel_and_a_dm_of_its_user() -> None:
    rec = interaction_record("discord:dc", SALT, cred(), command())
    env = rec.envelope or {}
    assert rec.dedupe_key == "interaction:42" and rec.status == names.INGRESS_ACCEPTED
    assert env["data"]["text"] == "/ask q: hi" and env["data"]["author"] == {
        "username": "ann", "global_name": "Ann"}  # fmt: skip
    assert env[names.GROUP_ATTRIBUTE] == names.GROUP_CHAT
    assert open_token(cred(), env["data"]["reply_to"]) == (APP, "tok")
    dm = command(guild_id=None, member=None, user={"id": "300", "username": "ann"})
    dm_env = interaction_record("discord:dc", SALT, cred(), dm).envelope or {}
    assert names.GROUP_ATTRIBUTE not in dm_env and dm_env["subject"] != env["subject"]
    same_user = message_record("discord:dc", SALT, {"id": "9", "channel_id": "555",
                                                    "author": {"id": "300"}})  # fmt: skip
    assert (same_user.envelope or {})["subject"] == dm_env["subject"]  # one thread per person
    dead = interaction_record("discord:dc", SALT, cred(), command(data={}))
    assert dead.status == names.INGRESS_DEAD and "tok" not in json.dumps(dead.envelope)


def test_a_message_is_a_record_of_its_channel_keyed_by_its_id() -> None:
    message = {"id": "77", "channel_id": "200", "guild_id": "100", "content": "hello",
               "author": {"id": "300", "username": "ann"}, "timestamp": "2026-12-02T01:00:00+00:00"}  # fmt: skip
    rec = message_record("discord:dc", SALT, message)
    env = rec.envelope or {}
    assert rec.dedupe_key == "message:77" and env["data"]["reply_to"] == "200"
    assert env["time"] == "2026-12-02T01:00:00+00:00" and not mentions("300", env)
    big = message_record("discord:dc", SALT, {**message, "content": "x" * 70_000})
    assert big.status == names.INGRESS_DEAD and big.size < 1000
    assert message_record("discord:dc", SALT, {"id": "1"}).status == names.INGRESS_DEAD


def test_options_render_with_subcommands_and_bounded_depth() -> None:
    options = [{"name": "add", "type": 1, "options": [{"name": "n", "type": 4, "value": 3},
                                                      {"name": "ok", "type": 5, "value": True}]}]  # fmt: skip
    assert render_options(options) == "add n: 3 ok: True"
    deep: list[dict[str, object]] = [{"name": "a", "type": 2, "options": []}]
    for _ in range(10):
        deep = [{"name": "a", "type": 2, "options": deep}]
    assert render_options(deep).split() == ["a", "a", "a"]
    assert render_options("junk") == "" and render_options([1, {"value": 2}]) == ""


def test_long_bodies_split_into_messages_with_their_own_nonces() -> None:
    body = ("word " * 1000).strip()
    split = parts(body)
    assert all(len(p) <= CONTENT_MAX for p in split) and " ".join(split) == body
    assert parts("x" * (CONTENT_MAX + 1)) == ["x" * CONTENT_MAX, "x"]
    assert parts("") == [""] and parts("short") == ["short"]
    assert len(nonce("k" * 200, 0)) == NONCE_MAX and nonce("k", 0) != nonce("k", 1)
    assert nonce("k", 0) == nonce("k", 0)


def test_the_gateway_wait_is_a_positive_setting() -> None:
    assert ChannelSettings.from_env({}).gateway_wait_s == 5
    assert ChannelSettings.from_env({"EVENTOS_CHANNELS_GATEWAY_WAIT_S": "2"}).gateway_wait_s == 2
    with pytest.raises(ConfigError, match="EVENTOS_CHANNELS_GATEWAY_WAIT_S"):
        ChannelSettings.from_env({"EVENTOS_CHANNELS_GATEWAY_WAIT_S": "0"})
