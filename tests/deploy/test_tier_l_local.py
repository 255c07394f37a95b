"""What the local tier L server runs is what the chart ships: `TemporalServer` renders the
chart's server ConfigMap, and only the places of things (addresses, ports, folders, the
database user and names, the shard count) differ from a real install's."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import charts
import yaml
from charts import ROOT, named

from eventos.local.temporal_server import TemporalServer
from eventos.settings import ServerTools

URL = "postgresql://instance-user:s3cret-pw@127.0.0.1:5999/postgres"
# Where the local config may differ from the shipped one, and nowhere else (plus its log level).
PLACES = {
    "persistence.numHistoryShards",
    "persistence.datastores.default.sql.connectAddr",
    "persistence.datastores.default.sql.user",
    "persistence.datastores.default.sql.databaseName",
    "persistence.datastores.visibility.sql.connectAddr",
    "persistence.datastores.visibility.sql.user",
    "persistence.datastores.visibility.sql.databaseName",
    "global.metrics.prometheus.listenAddress",
    "clusterMetadata.clusterInformation.active.rpcAddress",
    "clusterMetadata.clusterInformation.active.httpAddress",
    "dynamicConfigClient.filepath",
    *(
        f"services.{s}.rpc.{k}"
        for s in ("frontend", "history", "matching", "worker")
        for k in ("grpcPort", "membershipPort", "bindOnIP", "httpPort")
    ),
    "log.level",  # warn: the local server's log keeps to what needs attention
}


def loaded(text: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(re.sub(r"\{\{.*?\}\}", '"templated"', text))
    return doc


def differences(a: Any, b: Any, path: str = "") -> set[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        keys = set(a) | set(b)
        return set().union(
            *(differences(a.get(k), b.get(k), f"{path}.{k}".lstrip(".")) for k in keys)
        )
    return set() if a == b else {path}


def test_the_local_server_config_is_the_charts_with_only_places_changed(tmp_path: Path) -> None:
    server = TemporalServer(tmp_path, ServerTools.from_env({}, ROOT), database_url=URL, shards=4,
                            database="temporal_t", visibility_database="temporal_visibility_t")  # fmt: skip
    server.assign_ports()
    local = server.render_config()
    shipped = named(charts.instance("L"), "ConfigMap", f"{charts.RELEASE}-eventos-temporal-config")
    assert set(local) == {"server.yaml", "dynamicconfig.yaml"}
    assert local["dynamicconfig.yaml"] == shipped["data"]["dynamicconfig.yaml"]
    assert local["server.yaml"].startswith("# enable-template\n")
    mine, theirs = loaded(local["server.yaml"]), loaded(shipped["data"]["server.yaml"])
    assert differences(mine, theirs) <= PLACES
    assert mine["persistence"]["numHistoryShards"] == 4
    sql = mine["persistence"]["datastores"]["default"]["sql"]
    assert (sql["connectAddr"], sql["user"], sql["databaseName"]) == (
        "127.0.0.1:5999", "instance-user", "temporal_t")  # fmt: skip
    assert mine["services"]["frontend"]["rpc"]["grpcPort"] == server.port
    assert {s["rpc"]["bindOnIP"] for s in mine["services"].values()} == {"127.0.0.1"}
    assert mine["dynamicConfigClient"]["filepath"] == f"{server.config_dir}/dynamicconfig.yaml"
    # The password stays a template expression the server fills in from its environment.
    assert "s3cret-pw" not in local["server.yaml"]
    assert sql["password"] == "templated"
