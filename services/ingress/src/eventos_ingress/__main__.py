"""`python -m eventos_ingress`: read settings, wire, serve until SIGTERM."""

from __future__ import annotations

from eventos.runtime.service import run_main
from eventos_ingress.app import IngressConfig, build


async def main() -> None:
    service = await build(IngressConfig.from_env())
    await service.run()


if __name__ == "__main__":
    run_main("ingress", main())
