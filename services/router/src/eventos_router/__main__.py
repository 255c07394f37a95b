"""`python -m eventos_router`: read settings, wire, serve until SIGTERM."""

from __future__ import annotations

from eventos.runtime.service import run_main
from eventos_router.app import RouterConfig, build


async def main() -> None:
    service = await build(RouterConfig.from_env())
    await service.run()


if __name__ == "__main__":
    run_main("router", main())
